"""Write a sample dataset: JSON text records in sharded ArrayRecord files.

    python examples/write_sample.py [OUT_DIR] [--records N] [--shards K]

The records look like AG News (a label and a line of text), so every later
example and benchmark can share them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import aioloader

# Four topics (the labels) with their own words, plus common words: a model can learn it.
TOPICS = [
    ["market", "stocks", "profit", "shares", "bank", "trade", "investors", "economy"],
    ["team", "season", "game", "league", "coach", "score", "players", "match"],
    ["election", "minister", "vote", "court", "parliament", "policy", "party", "law"],
    ["model", "chip", "cloud", "data", "engine", "software", "launch", "device"],
]
COMMON = ["the", "a", "of", "in", "on", "city", "river", "storm", "report", "today", "new",
          "week", "year"]


def record(i: int, rng: random.Random) -> bytes:
    label = i % 4
    words = [rng.choice(TOPICS[label]) if rng.random() < 0.3 else rng.choice(COMMON)
             for _ in range(rng.randint(20, 160))]
    return json.dumps({"id": i, "label": label, "text": " ".join(words)}).encode()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?", default="data/sample")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--shards", type=int, default=4)
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(0)
    start = time.perf_counter()
    paths = [
        os.path.join(args.out_dir, f"train-{k:05d}-of-{args.shards:05d}.array_record")
        for k in range(args.shards)
    ]
    writers = [aioloader.ArrayRecordWriter(p) for p in paths]
    for i in range(args.records):
        writers[i % args.shards].write(record(i, rng))
    for w in writers:
        w.close()
    size = sum(os.path.getsize(p) for p in paths)
    took = time.perf_counter() - start
    print(
        f"wrote {args.records:,} records in {args.shards} shards to {args.out_dir}/ "
        f"({size / 2**20:.1f} MiB, {took:.1f} s)"
    )


if __name__ == "__main__":
    main()
