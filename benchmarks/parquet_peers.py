"""One run of the Parquet text workload by a peer of aioloader, described by a JSON-able spec.

The peers (`spec["lib"]`), each as its users would write it, over the same Parquet files:

- "grain-parquet": `grain.experimental.ParquetIterDataset(paths)` (its 16-file interleave),
  `WindowShuffleIterDataset(window_size=spec["window"])` (Grain's shuffle buffer for an
  IterDataset), `.map(decode)`, `.batch(256, batch_fn=fns.collate_rows)`; with
  `spec["workers"]` > 0, `.mp_prefetch(MultiprocessingOptions(num_workers=...))`, which
  slices the files among the worker processes;
- "hf": Hugging Face `datasets`: `load_dataset("parquet", data_files=paths, streaming=True)
  .shuffle(seed, buffer_size=spec["window"])` (it shuffles the files' order too), `.map(decode)`,
  `.batch(256)`; offline, nothing cached;
- "pyarrow": the limit, no loader at all: `pq.read_table` of each file in turn, one thread,
  then `json.loads` of every row's text, in file order.

aioloader's own runs go through `benchmarks.contenders` (`format: "parquet"`), which sends the
libraries above here; `benchmarks.contenders.run_child` runs any of them in a fresh process.
The builders are apart from the timed loop so a test can check what each one yields. A
child imports the peer's library and pyarrow before its clock starts (`preimport`), as it
does aioloader: the figures are the pipeline's, not the imports'.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .contenders import _Clock, _size

BATCH = 256
LIBS = ("grain-parquet", "hf", "pyarrow")


def grain_dataset(spec: dict[str, Any]) -> Any:
    """The Grain pipeline of `spec` (an IterDataset of batches)."""
    import grain

    from .fns import collate_rows, decode_parquet_text

    ds = grain.experimental.ParquetIterDataset([str(p) for p in spec["paths"]])
    if spec.get("window"):
        ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=spec["window"],
                                                         seed=spec.get("seed", 0))
    ds = ds.map(decode_parquet_text).batch(spec.get("batch", BATCH), batch_fn=collate_rows)
    if spec.get("workers"):
        from absl import flags

        flags.FLAGS.mark_as_parsed()  # mp_prefetch reads absl flags
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=spec["workers"]))
    return ds


def hf_dataset(spec: dict[str, Any]) -> Any:
    """The Hugging Face `datasets` streaming pipeline of `spec` (an IterableDataset of batches)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files: never ask the Hub
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import tqdm

    tqdm.tqdm.monitor_interval = 0  # no monitor thread: nothing is shown, nothing to watch
    import datasets

    from .fns import decode_parquet_text

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("parquet", data_files=[str(p) for p in spec["paths"]],
                               split="train", streaming=True)
    if spec.get("window"):
        ds = ds.shuffle(seed=spec.get("seed", 0), buffer_size=spec["window"])
    ds = ds.map(decode_parquet_text, remove_columns=["id", "text"])
    return ds.batch(spec.get("batch", BATCH))


def pyarrow_rows(paths: list[str]) -> Any:
    """The limit's loop: every row's decoded text, file by file (a generator)."""
    import json

    import pyarrow.parquet as pq

    loads = json.loads
    for p in paths:
        for text in pq.read_table(p, use_threads=False).column("text").to_pylist():
            yield loads(text)


def preimport(spec: dict[str, Any]) -> None:
    """Import what the run of `spec` will use (pyarrow for every Parquet contender)."""
    import pyarrow.parquet  # noqa: F401

    if spec["lib"] == "hf":
        import datasets  # noqa: F401
    elif spec["lib"] == "grain-parquet":
        import grain  # noqa: F401


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Iterate the peer named by `spec["lib"]`; the figures of `contenders._Clock`."""
    lib = spec["lib"]
    if lib == "pyarrow":
        clock = _Clock(spec)
        t, n = time.perf_counter(), 0
        for _ in pyarrow_rows([str(p) for p in spec["paths"]]):
            n += 1
        clock.got(None, n, t)
        return clock.result()
    if lib not in LIBS:
        raise ValueError(f"unknown Parquet peer {lib!r}; one of {LIBS}")
    clock = _Clock(spec)
    ds = grain_dataset(spec) if lib == "grain-parquet" else hf_dataset(spec)
    it = iter(ds)
    try:
        t = time.perf_counter()
        for batch in it:
            if not clock.got(batch, _size(batch, False), t):
                break
            t = time.perf_counter()
        return clock.result()  # (Grain's worker processes still run: their CPU counts)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
