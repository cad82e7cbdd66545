"""Grain's data-loading walkthrough notebook, cell by cell, on aioloader.

    python examples/grain_walkthrough.py [--records N] [--batch-size B] [--num-batches K]

Each section below is a cell of the notebook; the Grain line it replaces is in the comment
above it. The data is a generated news set of the notebook's shape (title, description,
label) in one ArrayRecord file, and the tokenizer is a small one of our own (no downloads),
so the run needs nothing but this repository. Functions are defined here, in `__main__`, as
in a notebook: they travel to worker processes by value (cloudpickle).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import zlib
from pprint import pprint

import numpy as np

import aioloader as al

# -- Set up input data ----------------------------------------------------------------------
# Grain: tfds.data_source("ag_news_subset") written with array_record's ArrayRecordWriter,
# "group_size:1". Here: a synthetic set of the same shape, written with ours.

TOPICS = [["stocks", "profit", "bank", "trade", "economy", "shares", "investors"],
          ["team", "season", "coach", "league", "score", "players", "match"],
          ["election", "minister", "vote", "court", "policy", "party", "law"],
          ["chip", "cloud", "software", "launch", "device", "data", "engine"]]
COMMON = ["the", "a", "of", "in", "on", "new", "report", "says", "week", "after", "its"]


def write_news(path: str, records: int) -> None:
    rng = random.Random(0)
    with al.ArrayRecordWriter(path, group_size=1) as writer:
        for i in range(records):
            label = i % 4

            def words(n: int, label: int = label) -> str:
                return " ".join(rng.choice(TOPICS[label]) if rng.random() < 0.3
                                else rng.choice(COMMON) for _ in range(n))

            writer.write(json.dumps({"description": words(rng.randint(10, 60)),
                                     "label": label,
                                     "title": words(rng.randint(3, 8))}).encode())


# -- Tokenize ---------------------------------------------------------------------------------
# Grain: a HuggingFace BertTokenizer. Here: words hashed into a 30,522-entry vocabulary with
# BERT's [CLS] = 101 and [SEP] = 102 around them (a stand-in; any tokenizer works).

VOCAB, CLS, SEP = 30522, 101, 102


def tokenize(element: dict) -> dict:
    ids = [1000 + zlib.crc32(w.encode()) % (VOCAB - 1000) for w in element["description"].split()]
    return {"description": np.asarray([CLS, *ids, SEP])}


sequence_length = 128


def trim_values(element: dict) -> dict:
    return {"description": element["description"][:sequence_length]}


def shapes(tree: dict) -> dict:
    return {k: f"{v.dtype}{list(v.shape)}" for k, v in tree.items()}


def time_iterator(it, num_batches: int, batch_size: int) -> None:
    """The notebook's own measure: time to the first batch, then batches/s."""
    start = time.perf_counter()
    next(it)
    print(f"Time to get the first batch: {time.perf_counter() - start:.02f} sec.")
    start = time.perf_counter()
    for _ in range(num_batches):
        next(it)
    total = time.perf_counter() - start
    print(f"Iterator throughput: {num_batches * batch_size / total:.02f} examples/sec; "
          f"{num_batches / total:.02f} batches/sec.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=120_000)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--num-batches", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--num-steps", type=int, default=40)
    # The notebook's step is 1 s; a step slower than loading a batch is the case shown.
    p.add_argument("--step-ms", type=float, default=250, help="simulated train step")
    p.add_argument("--restore-s", type=float, default=2, help="simulated model restore")
    args = p.parse_args()
    batch_size = args.batch_size

    with tempfile.TemporaryDirectory() as tmp:
        data_path = os.path.join(tmp, "train.array_record")
        write_news(data_path, args.records)
        print(f"Finished writing {args.records} examples "
              f"({os.path.getsize(data_path) / 2**20:.1f} MiB)")

        print("\n# Create source and examine the data")
        # Grain: source = grain.sources.ArrayRecordDataSource(data_path)
        source = al.ArrayRecordSource(data_path)
        print(f"{len(source)} examples")

        print("\n## Parse")
        # Grain: parsed_ds = grain.MapDataset.source(source).map(json.loads)
        parsed_ds = al.Dataset.from_source(source).map(json.loads)
        pprint(parsed_ds[0])  # computed in this process, as the loader would yield it

        print("\n## Tokenize")
        tokenized_ds = parsed_ds.map(tokenize)
        pprint(tokenized_ds[0])

        print("\n## Shuffle, repeat & shard")
        shuffled_ds = tokenized_ds.shuffle(seed=42)  # exact global shuffle
        repeated_ds = shuffled_ds.repeat(num_epochs=100)  # re-keyed every epoch
        shard_index = 1  # this will typically be jax.process_index()
        shard_count = 16  # this will typically be jax.process_count()
        sharded_ds = repeated_ds[shard_index::shard_count]  # or .shard_by_jax_process()
        print(f"{len(sharded_ds)} examples in shard {shard_index} of {shard_count}")
        pprint(sharded_ds[0])

        print("\n## Pack")
        # Grain: .to_iter_dataset() then grain.experimental.FirstFitPackIterDataset(...).
        # No conversion here: pack() is one more verb, and the pipeline stays checkpointable.
        packed_ds = sharded_ds.map(trim_values).pack(
            {"description": sequence_length}, num_packing_bins=30)
        first = next(iter(packed_ds))
        print(shapes(first), "segments in row 0:", int(first["description_segment_ids"].max()))

        print("\n## Batch")
        batched_ds = packed_ds.batch(batch_size, drop_remainder=True)
        it = iter(batched_ds)
        batch = next(it)
        pprint(shapes(batch))
        it.close()

        print("\n## Enable visualization mode")
        # Grain: grain.config.update("py_dataset_visualization_output_dir", "")
        print(batched_ds.graph())

        print("\n# Measure throughput (workers=0: everything on one thread of this process)")
        with batched_ds.loader(workers=0) as loader:
            time_iterator(iter(loader), args.num_batches, batch_size)
            print("\n## Performance debug mode: the stats table of that run")
            # Grain: grain.config.update("py_debug_mode", True)
            print(loader.stats())

        print(f"\n## Bottleneck with GIL: {args.workers} worker processes")
        # Grain: ds.mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=16))
        with batched_ds.loader(workers=args.workers) as loader:
            time_iterator(iter(loader), args.num_batches, batch_size)

        print("\n# Data loading is faster than training")
        step_s = args.step_ms / 1000

        def train(loader: al.Loader, restore_s: float = 0.0) -> None:
            it = iter(loader)
            start = time.perf_counter()
            time.sleep(restore_s)  # restore_model()
            for _ in range(args.num_steps):
                next(it)
                time.sleep(step_s)  # train_step(batch)
            took = time.perf_counter() - start
            idle = (took - args.num_steps * step_s - restore_s) / took
            print(f"Spent {idle * 100:.2f}% of time waiting for data")

        # Grain: the loop above with a plain iterator waits on every batch, and
        # ThreadPrefetchIterDataset(prefetch_buffer_size=3) hides it. A loader always
        # works ahead in the background: `prefetch` batches (default 4).
        print("### Background prefetching (prefetch=3)")
        with batched_ds.loader(workers=args.workers, prefetch=3) as loader:
            train(loader)

        print("### Hide first batch processing behind checkpoint recovery")
        with batched_ds.loader(workers=args.workers, prefetch=3) as loader:
            loader.start_prefetch()  # opens the file, starts workers, fills the prefetch
            train(loader, restore_s=args.restore_s)
        source.close()


if __name__ == "__main__":
    main()
