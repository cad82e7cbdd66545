"""One pipeline run of aioloader or Grain, described by a JSON-able spec, in-process or as a child.

`run(spec)` builds `source → shuffle → [slice] → [repeat] → map(decode) → [filter] → [pack]
→ batch(256)` with the library named by `spec["lib"]`, iterates it, and returns what the
benchmarks need: records, batches, wall seconds, time to first batch, seconds the consumer
waited, CPU seconds (the process plus its reaped children, i.e. aioloader's worker processes)
and `parent_cpu` (this process alone: its event-loop thread included).

`python -m benchmarks.contenders SPEC_JSON` runs the same in a fresh interpreter and prints the
result as one JSON line. The benchmarks use that when the run must be isolated: Grain against
the emulated bucket (it may hang: the parent enforces a timeout), runs stopped early (Grain's
prefetch threads would keep working in the parent), and memory figures (a clean baseline).

Spec keys: lib ("aioloader" | "grain"), paths, decode (a name in `benchmarks.fns`), seed,
shuffle ("exact" | "block" | None), window, limit (first N shuffled positions), epochs,
batch (0: unbatched; after a pack, rows per batch), filter (aioloader: a predicate's name in
`benchmarks.fns`), pack (aioloader: {"lengths": {feature: length}, "bins": N}), max_batches,
max_seconds, step (seconds of simulated training per batch), workers, executor, prefetch,
io_concurrency, max_gap, memory_budget, resident_bytes, storage_options, verify (aioloader;
its default if absent), threads (Grain's ReadOptions.num_threads), procs (Grain's worker
processes, `mp_prefetch`), api ("sync" | "async",
aioloader), format ("tfrecord" / "parquet": aioloader reads `paths` as TFRecord / Parquet
files), index_cache_dir (aioloader). The Parquet peers ("grain-parquet", "hf", "pyarrow") run
from `benchmarks.parquet_peers`, with its keys.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from .common import cpu_seconds


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _decode(name: str):
    from . import fns

    return getattr(fns, name)


class _Clock:
    """Timestamps of one iteration: first batch, waits, stop conditions."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.t0 = time.perf_counter()
        self.cpu0 = cpu_seconds()
        self.parent_cpu0 = time.process_time()
        self.first: float | None = None
        self.first_wait = 0.0
        self.first_size = 0
        self.opened: float | None = None
        self.last = self.t0
        self.wait = 0.0
        self.batches = 0
        self.records = 0
        self.step = float(spec.get("step") or 0.0)

    def got(self, batch: Any, size: int, waited_since: float, sleep: bool = True) -> bool:
        """Account for one delivered batch; False when the run should stop.

        The training step (`spec["step"]`) is a `time.sleep` here; async callers pass
        `sleep=False` and await it themselves."""
        now = time.perf_counter()
        self.wait += now - waited_since
        if self.first is None:
            self.first = now - self.t0
            self.first_wait = now - waited_since
            self.first_size = size
        self.last = now
        self.batches += 1
        self.records += size
        if self.step and sleep:
            time.sleep(self.step)  # the training step: the loader works meanwhile
        spec = self.spec
        if spec.get("max_batches") and self.batches >= spec["max_batches"]:
            return False
        return not (spec.get("max_seconds") and now - self.t0 >= spec["max_seconds"])

    def result(self) -> dict[str, Any]:
        end = self.last
        wall = end - self.t0
        return {
            "records": self.records, "batches": self.batches, "wall": wall,
            "ttfb": self.first, "wait": self.wait, "first_wait": self.first_wait,
            "cpu": cpu_seconds() - self.cpu0,
            "parent_cpu": time.process_time() - self.parent_cpu0,
            "first_size": self.first_size,
            "opened": self.opened, "training": self.step * self.batches,
            "rate": self.records / wall if wall > 0 else 0.0,
        }


def _size(batch: Any, unbatched: bool) -> int:
    if unbatched:
        return 1
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return len(batch)


# -- aioloader ------------------------------------------------------------------------------


def _aio_dataset(spec: dict[str, Any]):
    import aioloader as al

    verify = {"verify": spec["verify"]} if spec.get("verify") else {}
    # by name: a tree measured by compare_trees.py may predate a format
    source = getattr(al.Dataset, {"tfrecord": "from_tfrecord", "parquet": "from_parquet"}.get(
        spec.get("format") or "", "from_arrayrecord"))
    ds = source(spec["paths"], storage_options=spec.get("storage_options") or None, **verify)
    shuffle = spec.get("shuffle", "exact")
    if shuffle == "block":
        ds = ds.shuffle(spec.get("seed", 0), strategy="block",
                        block_bytes=spec.get("block_bytes"),
                        window_bytes=spec.get("window_bytes"))
    elif shuffle:
        ds = ds.shuffle(spec.get("seed", 0))
    if spec.get("limit"):
        ds = ds[: spec["limit"]]
    if spec.get("epochs", 1) > 1:
        ds = ds.repeat(spec["epochs"])
    ds = ds.map(_decode(spec["decode"]))
    if spec.get("filter"):
        ds = ds.filter(_decode(spec["filter"]))
    if spec.get("pack"):
        ds = ds.pack(spec["pack"]["lengths"], num_packing_bins=spec["pack"]["bins"])
    return ds.batch(spec["batch"]) if spec.get("batch", 256) else ds


def _aio_options(spec: dict[str, Any]) -> dict[str, Any]:
    keys = ("workers", "prefetch", "io_concurrency", "max_gap", "memory_budget",
            "resident_bytes", "executor", "index_cache_dir")
    return {k: spec[k] for k in keys if spec.get(k) is not None}


def aio_run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("api") == "async":
        return _aio_run_async(spec)
    ds = _aio_dataset(spec)
    unbatched = not spec.get("batch", 256)
    clock = _Clock(spec)
    with ds.loader(**_aio_options(spec)) as it:
        t = time.perf_counter()
        for batch in it:
            if not clock.got(batch, _size(batch, unbatched), t):
                break
            t = time.perf_counter()
        stats = it.stats().as_dict()
        out = clock.result()  # the workers still run: their CPU time is counted
    out["io"] = stats.get("io", {})
    out["autotune"] = stats.get("autotune")
    return out


def _aio_run_async(spec: dict[str, Any]) -> dict[str, Any]:

    import asyncio

    from .common import new_event_loop

    ds = _aio_dataset(spec)
    unbatched = not spec.get("batch", 256)

    async def main() -> dict[str, Any]:
        clock = _Clock(spec)
        async with ds.loader(**_aio_options(spec)) as it:
            clock.opened = time.perf_counter() - clock.t0  # files indexed, fetching started
            t = time.perf_counter()
            async for batch in it:
                more = clock.got(batch, _size(batch, unbatched), t, sleep=False)
                if clock.step:
                    await asyncio.sleep(clock.step)  # the step, awaited: the loader runs
                if not more:
                    break
                t = time.perf_counter()
            stats = it.stats().as_dict()
            out = clock.result()  # the workers still run: their CPU time is counted
        out["io"] = stats.get("io", {})
        out["autotune"] = stats.get("autotune")
        return out

    loop = new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


# -- Grain ----------------------------------------------------------------------------------


def grain_run(spec: dict[str, Any]) -> dict[str, Any]:
    """Grain's faster order: batch on the MapDataset, then to_iter_dataset(ReadOptions)."""
    import grain

    clock = _Clock(spec)
    src = grain.sources.ArrayRecordDataSource([str(p) for p in spec["paths"]])
    ds = grain.MapDataset.source(src)
    if spec.get("shuffle", "exact"):
        ds = ds.shuffle(seed=spec.get("seed", 0))
    if spec.get("limit"):
        ds = ds[: spec["limit"]]
    if spec.get("epochs", 1) > 1:
        ds = ds.repeat(spec["epochs"])
    ds = ds.map(_decode(spec["decode"]))
    unbatched = not spec.get("batch", 256)
    if not unbatched:
        ds = ds.batch(spec["batch"])
    out = ds.to_iter_dataset(grain.ReadOptions(num_threads=spec.get("threads", 1)))
    if spec.get("procs"):  # Grain's worker processes, as aioloader's workers=N
        from absl import flags  # (Grain's processes read its flags: parsed, as by app.run)

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        out = out.mp_prefetch(grain.MultiprocessingOptions(num_workers=spec["procs"]))
    it = iter(out)
    t = time.perf_counter()
    for batch in it:
        if not clock.got(batch, _size(batch, unbatched), t):
            break
        t = time.perf_counter()
    return clock.result()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["lib"] == "aioloader":
        return aio_run(spec)
    if spec["lib"] == "grain":
        return grain_run(spec)
    from .parquet_peers import run as run_parquet_peer

    return run_parquet_peer(spec)


def main() -> None:
    """Child mode: import the library, note the baseline RSS, run, print one JSON line."""
    spec = json.loads(sys.argv[1])
    os.environ.setdefault("GRAIN_LOG_LEVEL", "error")
    if spec["lib"] == "grain":
        import grain  # noqa: F401
    elif spec["lib"] == "aioloader":
        import aioloader  # noqa: F401
    if spec["lib"] not in ("grain", "aioloader") or spec.get("format") == "parquet":
        from .parquet_peers import preimport

        preimport(spec)
    baseline = rss_bytes()
    out = run(spec)
    out["baseline_rss"] = baseline
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # Grain's prefetch threads may still be busy: don't wait for them


if __name__ == "__main__":
    main()
