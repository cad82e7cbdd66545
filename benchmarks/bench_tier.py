"""The bounded memory tier: a bucket dataset 4x larger than `resident_bytes`, against the same
pipeline on local disk, side by side in one run (issue 15).

Data: 1 KiB JSON text records (zstd, ~0.6 KiB on disk) in 20 shards, group_size 1 (and the
same records at group_size 64), at least 4x `--tier-mib` (default 32 MiB) on disk. The bucket
is the emulator behind the delay line at 30 ms + 10 ms jitter (its own process). Pipeline:
[order] → map(json.loads) → batch(256), workers=2, one whole epoch timed from building the
loader (opening included). Orders:

- sequential (no shuffle): every segment is dense: the tier fetches them ahead;
- block shuffle over today's chunks, group_size 64 (a stand-in until blocks are byte runs):
  a chunk here and there per segment, so the tier leaves it to chunk reads;
- exact shuffle: sparse, record by record (first N batches only: it runs at the request rate).

Each repeat runs local then bucket, then bucket then local (ABBA); the ratio is paired per
repeat. The bucket rows say how many requests the run made and what the tier did.

`python -m benchmarks run --only tier [--repeats N] [--quick]`
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

from .bench_pipeline import BATCH, TEXT_BYTES, reps
from .common import Row, Runs, cpu_seconds, log, new_event_loop, register, sharded_dataset
from .common import throughput_row as _row
from .contenders import _aio_dataset

SHARDS = 20
WORKERS = 2


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    """One pipeline run in this process (the bucket's stats need the loader's)."""
    ds = _aio_dataset(spec)
    opts = {k: spec[k] for k in ("workers", "resident_bytes", "memory_budget")
            if spec.get(k) is not None}

    async def main() -> dict[str, Any]:
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        records, first = 0, None
        async with ds.loader(**opts) as it:
            async for batch in it:
                records += len(next(iter(batch.values())) if isinstance(batch, dict)
                               else batch)
                if first is None:
                    first = time.perf_counter() - t0
                if spec.get("max_batches") and records >= spec["max_batches"] * BATCH:
                    break
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
            st = it.stats().as_dict()
        return {"records": records, "wall": wall, "cpu": cpu, "ttfb": first,
                "io": st.get("io", {}), "cache": st.get("cache", {})}

    gc.collect()
    loop = new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def _runs(results: list[dict[str, Any]]) -> Runs:
    return Runs([r["wall"] / r["records"] for r in results],
                [r["cpu"] / r["records"] for r in results])


def _tier_note(results: list[dict[str, Any]]) -> str:
    r = results[-1]
    io, c = r["io"], r["cache"]
    what = (f"tier: {c['tier_fetched']:,} segments fetched, {c['tier_evictions']:,} evicted, "
            f"{c['tier_records']:,} records from memory" if c.get("tier_fetched") else
            "tier: no segment fetched (sparse)")
    ttfb = sorted(x["ttfb"] for x in results)[len(results) // 2]
    return (f"{io.get('reads', 0):,} requests, {io.get('records_per_read', 0):.1f} records "
            f"per read; {what}; first batch {ttfb:.2f} s")


def _size_mb(paths: list[Path]) -> float:
    return sum(p.stat().st_size for p in paths) / 1e6


@register("tier", "bucket dataset 4x resident_bytes (bounded memory tier) vs local disk, "
                  "30 ms + 10 ms emulator", peer="local disk")
def run_tier(args: Any) -> list[Row]:
    from aioloader.testing import local_gcs

    tier = (getattr(args, "tier_mib", None) or 32) << 20
    quick = getattr(args, "quick", False)
    n = 240_000 if not quick else 120_000
    if quick:
        tier //= 2
    g1 = sharded_dataset(args, "text", n, SHARDS)
    g64 = sharded_dataset(args, "text", n, SHARDS, group_size=64)
    size = _size_mb(g1)
    log(f"tier: {n:,} records, {size:.0f} MB on disk ({size * 1e6 / tier:.1f}x the tier)")
    r = reps(args, 5, 2)
    rows = []
    with local_gcs(latency_ms=30, jitter_ms=10, proxy_process=True) as gcs:
        opts = gcs.storage_options
        urls1 = [gcs.upload(p, f"t1/{p.name}") for p in g1]
        urls64 = [gcs.upload(p, f"t64/{p.name}") for p in g64]
        base = {"lib": "aioloader", "decode": "decode_text", "batch": BATCH, "seed": 0,
                "workers": WORKERS}
        cases = [
            ("sequential (no shuffle), group_size 1", {"shuffle": None}, g1, urls1),
            ("block shuffle (1 MiB blocks, 8 MiB window), group_size 64",
             {"shuffle": "block", "block_bytes": 1 << 20, "window_bytes": 8 << 20}, g64, urls64),
            ("exact shuffle, group_size 1, first 40 batches",
             {"shuffle": "exact", "max_batches": 40}, g1, urls1),
        ]
        only = getattr(args, "tier_cases", None)
        cases = cases[:only] if only else cases
        for label, extra, local, remote in cases:
            lspec = {**base, **extra, "paths": [str(p) for p in local]}
            rspec = {**base, **extra, "paths": remote, "storage_options": opts,
                     "resident_bytes": tier}
            log(f"tier: {label}: warm-up")
            _run({**lspec, "max_batches": 4})
            _run({**rspec, "max_batches": 4})
            res: dict[str, list] = {"local": [], "bucket": []}
            for k in range(r):
                order = ("local", "bucket") if k % 2 == 0 else ("bucket", "local")
                for which in order:
                    out = _run(lspec if which == "local" else rspec)
                    res[which].append(out)
                    log(f"tier: {label}: {which} {out['records'] / out['wall']:,.0f} rec/s")
            rows.append(_row(
                f"text 1 KiB, {SHARDS} shards, {size:.0f} MB = {size * 1e6 / tier:.1f}x "
                f"resident_bytes ({tier >> 20} MiB), json.loads, {label}: bucket vs local",
                _runs(res["bucket"]), _runs(res["local"]), 1.0, "rec/s", TEXT_BYTES,
                f"workers={WORKERS}, whole epoch incl. opening; bucket: emulator 30 ms + "
                f"10 ms jitter; {_tier_note(res['bucket'])}"))
    return rows


if __name__ == "__main__":  # a quick look without the table machinery
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--tier-mib", type=int, default=None)
    p.add_argument("--tier-cases", type=int, default=None)
    for row in run_tier(p.parse_args()):
        print(row)
    asyncio.run(asyncio.sleep(0))
