"""Before/after on local files: one pipeline read by two aioloader trees, interleaved.

    python benchmarks/ab_local_read.py --before /tmp/base --after . --rounds 3 \\
        [--records 60000] [--shards 20] [--workers 0 --workers 2] [--data-dir DIR]

The text workload of `pipeline` (1 KiB JSON records, array_record's writer, zstd:3, group
size 1, `shards` files): global shuffle, `json.loads`, batch 256, one epoch per run, timed
from its first batch on. Each run is a fresh process with `PYTHONPATH=<tree>` (checked), in
ABBA order per round, so drift hits both trees alike; a run reports records/s (wall) and
CPU-seconds per 1k records (the process and its workers, by psutil). The table: each tree's
median over rounds, and the median of the per-round after ÷ before ratios (> 1: after is
faster, or uses less CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, os, sys, time
import psutil
import aioloader as al
assert al.__file__.startswith(sys.argv[1]), al.__file__
paths, workers, total = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ds = al.Dataset.from_arrayrecord(paths).shuffle(seed=1).map(json.loads).batch(256)
def cpu():  # this process and its tree (workers are the forkserver's children)
    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])
it = iter(ds.loader(workers=workers))
first = seen = len(next(iter(next(it).values())))  # a batch of JSON: a dict of columns
c0, t0 = cpu(), time.perf_counter()  # from the first batch on: the steady state
for b in it:
    seen += len(next(iter(b.values())))
    if seen == total:  # measured before the loader ends (its workers exit then)
        break
t, c = time.perf_counter() - t0, cpu() - c0
n = seen - first
it.close()
print(json.dumps({"rate": n / t, "cpu_per_1k": 1000 * c / n}))
"""


def run(tree: Path, paths: list[str], workers: int, total: int, python: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([python, "-c", CHILD, str(tree), json.dumps(paths), str(workers),
                          str(total)],
                         env=env, capture_output=True, text=True, cwd="/", check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--records", type=int, default=60_000)
    p.add_argument("--shards", type=int, default=20)
    p.add_argument("--workers", type=int, action="append")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.common import sharded_dataset

    paths = [str(x) for x in sharded_dataset(args, "text", args.records, args.shards)]
    before, after = args.before.resolve(), args.after.resolve()
    print("| workers | before rec/s | after rec/s | after ÷ before | before CPU-s/1k | "
          "after CPU-s/1k | before ÷ after CPU |\n|---|---:|---:|---:|---:|---:|---:|")
    for workers in args.workers or [0, 2]:
        got: dict[str, list[dict]] = {"b": [], "a": []}
        for r in range(args.rounds):
            order = [("b", before), ("a", after)]
            for tag, tree in (order if r % 2 == 0 else order[::-1]):
                got[tag].append(run(tree, paths, workers, args.records, args.python))
        rate = [a["rate"] / b["rate"] for b, a in zip(got["b"], got["a"])]
        cpu = [b["cpu_per_1k"] / a["cpu_per_1k"] for b, a in zip(got["b"], got["a"])]

        def med(tag: str, key: str, got: dict = got) -> float:
            return statistics.median(x[key] for x in got[tag])

        print(f"| {workers} | {med('b', 'rate') / 1e3:.1f}k | {med('a', 'rate') / 1e3:.1f}k | "
              f"{statistics.median(rate):.2f}× [{min(rate):.2f}–{max(rate):.2f}] | "
              f"{med('b', 'cpu_per_1k'):.3f} | {med('a', 'cpu_per_1k'):.3f} | "
              f"{statistics.median(cpu):.2f}× [{min(cpu):.2f}–{max(cpu):.2f}] |", flush=True)


if __name__ == "__main__":
    main()
