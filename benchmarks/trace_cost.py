"""What recording a trace costs: the same pipeline with `trace=False` and `trace=True`, ABBA.

    PYTHONPATH=. python benchmarks/trace_cost.py --data-dir /tmp/benchdata --rounds 8

The text workload of `pipeline` (20 shards of 1 KiB JSON, global shuffle, json.loads, batch
256), one epoch per run, off and on alternating (off, on; on, off; ...). With workers=0 all
the work is in this process, so its CPU time per record (`time.process_time`) holds the
whole cost of the hooks and the spans; with workers=2 the wall-clock rate is what a user
sees. Writing the file is timed apart (it happens once, when asked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aioloader as al


def decode(b: bytes) -> dict:
    d = json.loads(b)
    return {"id": d["id"]}


def one(paths: list[str], workers: int, trace: bool) -> tuple[float, float, float, int]:
    ds = al.Dataset.from_arrayrecord(paths).shuffle(1).map(decode).batch(256)
    c0, t0 = time.process_time(), time.perf_counter()
    n = 0
    with ds.loader(workers=workers, trace=trace) as it:
        for b in it:
            n += len(b["id"])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        write = 0.0
        if trace:
            with tempfile.TemporaryDirectory() as d:
                w0 = time.perf_counter()
                it.stats().trace(Path(d) / "t.json")
                write = time.perf_counter() - w0
    return n / wall, cpu / n * 1e6, write, n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--workers", type=int, action="append")
    args = p.parse_args()
    shards = args.data_dir / "text-n20000-s20-g1-zstd3-v1"
    paths = sorted(str(x) for x in shards.glob("*.array_record"))
    for workers in args.workers or [0, 2]:
        one(paths, workers, True)  # warm up: page cache, imports, the forkserver
        got: dict[bool, list[tuple[float, float, float, int]]] = {False: [], True: []}
        for r in range(args.rounds):
            for trace in ((False, True) if r % 2 == 0 else (True, False)):
                got[trace].append(one(paths, workers, trace))
        print(f"workers={workers}, {got[False][0][3]:,} records, {args.rounds} ABBA rounds")
        for k, name, unit in ((0, "rate", "rec/s"), (1, "CPU per record (this process)",
                                                     "us")):
            off = [x[k] for x in got[False]]
            on = [x[k] for x in got[True]]
            ratios = [b / a for a, b in zip(off, on)]
            print(f"  {name}: off {statistics.median(off):,.2f} [{min(off):,.2f}-"
                  f"{max(off):,.2f}] {unit}, on {statistics.median(on):,.2f} [{min(on):,.2f}-"
                  f"{max(on):,.2f}]; on/off per round {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}-{max(ratios):.3f}]")
        writes = [x[2] for x in got[True]]
        print(f"  writing the trace file: {statistics.median(writes) * 1e3:.1f} ms")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
