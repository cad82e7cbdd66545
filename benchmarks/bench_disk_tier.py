"""Issue 15, the disk tier: an exact shuffle of a text dataset 4x+ `resident_bytes`, from the
emulator behind a 30 ms ± 10 ms delay line (in a child process), side by side in one run:

- local: the same pipeline on the local files (the target for the second epoch);
- record by record: today's path for a dataset larger than `resident_bytes` (its first
  `--rbr-batches` batches: the rate is steady, a whole epoch would take minutes);
- disk tier, epoch 1: `cache_dir` empty at the start (the filler downloads while reads go on);
- disk tier, epoch 2: a new loader over the filled `cache_dir` (as a restarted job).

Rounds alternate the order (ABBA). Run: `python -m benchmarks.bench_disk_tier [--rounds 2]`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aioloader as al
from aioloader.testing import local_gcs

from . import fns
from .common import sharded_dataset

RESIDENT = 32 << 20


def pipeline(paths, opts=None, seed=0):
    return (al.Dataset.from_arrayrecord(paths, storage_options=opts or {}).shuffle(seed)
            .map(fns.decode_text).batch(256))


async def epoch(ds, limit=None, wait_filled=False, **kw):
    """Records/s over the epoch (or its first `limit` batches), and the cache figures."""
    async with ds.loader(workers=2, resident_bytes=RESIDENT, **kw) as it:
        t0 = time.perf_counter()
        n = k = 0
        async for b in it:
            n += len(b["id"])
            k += 1
            if limit and k >= limit:
                break
        dt = time.perf_counter() - t0
        cache = it.stats().as_dict()["cache"]
        while wait_filled and not it.stats().as_dict()["cache"].get("disk_filled", True):
            await asyncio.sleep(0.05)
    return n / dt, cache


async def main(args) -> None:
    ns = argparse.Namespace(data_dir=args.data_dir)
    paths = [str(p) for p in sharded_dataset(ns, "text", args.records, 20)]
    size = sum(Path(p).stat().st_size for p in paths)
    print(f"dataset: {args.records} records of 1 KiB JSON, 20 shards, {size / 2**20:.0f} MiB "
          f"on disk = {size / RESIDENT:.1f}x resident_bytes", flush=True)
    rates: dict[str, list[float]] = {"local": [], "rbr": [], "disk1": [], "disk2": []}
    with local_gcs(latency_ms=30, jitter_ms=10, proxy_process=True) as gcs:
        urls = [gcs.upload(p, f"t/{Path(p).name}") for p in paths]
        local, remote = pipeline(paths), pipeline(urls, gcs.storage_options)

        async def run(name: str, cache_dir: str | None) -> None:
            if name == "local":
                r, c = await epoch(local)
            elif name == "rbr":
                r, c = await epoch(remote, limit=args.rbr_batches)
            else:
                r, c = await epoch(remote, wait_filled=name == "disk1", cache_dir=cache_dir)
            rates[name].append(r)
            extra = {k: v for k, v in c.items() if k.startswith("disk_")}
            print(f"  {name:6s} {r:10,.0f} rec/s  {extra}", flush=True)

        for rnd in range(args.rounds):
            cache_dir = tempfile.mkdtemp(prefix="aioloader-disk-bench-")
            order = ["local", "rbr", "disk1", "disk2"]
            if rnd % 2:
                order = ["disk1", "disk2", "rbr", "local"]
            print(f"round {rnd + 1}: {' '.join(order)}", flush=True)
            for name in order:
                await run(name, cache_dir)
            shutil.rmtree(cache_dir)

    def med(xs):
        return statistics.median(xs)

    def ratios(a, b):
        rs = [x / y for x, y in zip(rates[a], rates[b])]
        return f"{med(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"

    print("\n| path | records/s, median (range) |\n|---|---|")
    labels = {"local": "local disk, same pipeline", "rbr": "gs://, record by record (today)",
              "disk1": "gs://, disk tier, first epoch (cache empty)",
              "disk2": "gs://, disk tier, second epoch (new loader)"}
    for k, label in labels.items():
        print(f"| {label} | {med(rates[k]):,.0f} ({min(rates[k]):,.0f}-{max(rates[k]):,.0f}) |")
    print(f"\nfirst epoch / record by record: {ratios('disk1', 'rbr')} (target >= 4)")
    print(f"second epoch / local: {ratios('disk2', 'local')} (target >= 0.8)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=240_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rbr-batches", type=int, default=40)
    p.add_argument("--data-dir", default="/tmp/aioloader-disk-bench-data")
    asyncio.run(main(p.parse_args()))
