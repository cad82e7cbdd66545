"""CPU per position of the index lookup a task makes (`plan.index.lookup` of 1024 positions),
for a one-source plan (before/after trees: the path every pipeline takes) and, where the tree
has them, for mix and concatenate plans.

    python benchmarks/mix_lookup.py --before /work/wt-mix-base --after /work/wt-mix --rounds 6

Each round runs a child per tree in ABBA order (`PYTHONPATH=<tree>`); a child times many
lookups with `time.process_time` and reports the best of 3 repeats, in ns per position. The
table gives the median [min–max] over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, time
import numpy as np
from aioloader.index.indexplan import IndexPlan
from aioloader.index.sampling import Repeat, Shard, Shuffle
N, TASK, LOOPS = 1_000_000, 1024, 30
plans = {"one source: shuffle, repeat, shard": IndexPlan(N, [Shuffle(1), Repeat(None),
                                                             Shard(0, 2)])}
try:
    from aioloader.index.selection import MixedIndex, proportions
    ins = (IndexPlan(N // 2, [Shuffle(1), Repeat(None)]), IndexPlan(N // 2, [Shuffle(2),
                                                                            Repeat(None)]))
    for name, seed in (("mix of 2 (Grain order), shard", None), ("mix of 2, seed, shard", 5)):
        base = MixedIndex(ins, (0, N // 2), proportions([0.3, 0.7], 2), seed)
        plans[name] = IndexPlan(N, [Shard(0, 2)], base=base)
    cat = MixedIndex((IndexPlan(N // 2, [Shuffle(1)]), IndexPlan(N // 2, [Shuffle(2)])),
                     (0, N // 2))
    plans["concatenate 2, repeat, shard"] = IndexPlan(N, [Repeat(None), Shard(0, 2)],
                                                      base=cat)
except ImportError:
    pass
out = {}
for name, plan in plans.items():
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for k in range(LOOPS):
            plan.lookup(np.arange(k * TASK, (k + 1) * TASK, dtype=np.int64))
        best = min(best, time.process_time() - t)
    out[name] = best / (LOOPS * TASK) * 1e9
print(json.dumps(out))
"""


def child(tree: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True, cwd="/")
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for which in order:
            runs[which].append(child(getattr(args, which)))
    print("| lookup (1024 positions a task) | before ns/position | after ns/position | "
          "after ÷ before |")
    print("|---|---:|---:|---:|")
    for name in runs["after"][0]:
        a = [x[name] for x in runs["after"]]
        b = [x[name] for x in runs["before"] if name in x]
        fa = f"{statistics.median(a):.0f} [{min(a):.0f}–{max(a):.0f}]"
        if b:
            ratios = [x / y for x, y in zip(a, b, strict=True)]
            fb = f"{statistics.median(b):.0f} [{min(b):.0f}–{max(b):.0f}]"
            fr = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}]"
        else:
            fb, fr = "—", "—"
        print(f"| {name} | {fb} | {fa} | {fr} |")


if __name__ == "__main__":
    main()
