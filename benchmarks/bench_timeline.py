"""What keeping the stats over time costs (`aioloader.runtime.timeline`, for the run report):
two trees side by side, each measurement in a fresh process, trees interleaved per round.

    python benchmarks/bench_timeline.py --before /path/to/main --after . --rounds 5

Per tree and round:
- `note_batch ns`: one `PipelineStats.note_batch` as the loader calls it per batch handed out
  (the two clock readings around the wait included; the timeline adds a comparison, and a
  snapshot every 0.5 s), with I/O and cache sources shaped as the loader's;
- `loop k batches/s`: a loader over a local file, workers=0, `map(len)`, batch 4 (batches as
  small as they come, so a per-batch cost shows), 20,000 batches;
- after only: `snapshot us` (one snapshot: the counters of every stage, I/O and cache) and
  `512 snapshots KB` (the ring full, by tracemalloc).

Ratios after ÷ before are taken per round; the table gives median [min–max].
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import inspect, json, sys, time, tracemalloc
import aioloader as al
from aioloader.io.storage import IOStats
from aioloader.runtime.stats import PipelineStats

out = {}
io = IOStats()
cache = {"hits": 0, "misses": 0, "bytes": 0}
ps = PipelineStats(workers=2, prefetch=8, io_source=io.as_dict, cache_source=lambda: dict(cache))
n = 300_000
clock = time.perf_counter
t0 = clock()
if "now" in inspect.signature(ps.note_batch).parameters:  # as `Run.next` calls it
    for _ in range(n):
        asked = clock()
        now = clock()
        ps.note_batch(now - asked, 1, now)
else:
    for _ in range(n):
        asked = clock()
        ps.note_batch(clock() - asked, 1)
out["note_batch_ns"] = (clock() - t0) / n * 1e9
if hasattr(ps, "timeline"):
    k = 20_000
    t0 = time.perf_counter()
    for i in range(k):
        ps._snapshot(float(i))
    out["snapshot_us"] = (time.perf_counter() - t0) / k * 1e6
    from aioloader.runtime.timeline import Timeline
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    tl = Timeline(ps._snapshot, interval=1.0, max_samples=512)
    for i in range(512):
        tl.take(float(i))
    after = tracemalloc.take_snapshot()
    out["ring_kb"] = sum(s.size_diff for s in after.compare_to(before, "filename")) / 1e3
    tracemalloc.stop()
ds = al.Dataset.from_arrayrecord(sys.argv[1]).repeat().map(len).batch(4)
with ds.loader(workers=0) as it:
    batches = iter(it)
    for _ in range(200):
        next(batches)
    m = 20_000
    t0 = time.perf_counter()
    for _ in range(m):
        next(batches)
    out["loop_kbatches_s"] = m / (time.perf_counter() - t0) / 1e3
print(json.dumps(out))
"""


def _run(tree: str, data: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.run([sys.executable, "-c", CHILD, data], env=env, cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}–{max(values):.3g}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    before, after = (str(Path(t).resolve()) for t in (args.before, args.after))
    sys.path.insert(0, after)
    import aioloader as al

    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "d.array_record")
        with al.ArrayRecordWriter(data, group_size=64) as w:
            for i in range(4096):
                w.write(bytes([i % 251]) * 64)
        rows: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = [("before", before), ("after", after)]
            for name, tree in order if r % 2 == 0 else order[::-1]:
                rows[name].append(_run(tree, data))
                print(f"round {r} {name}: {rows[name][-1]}", file=sys.stderr)
    b, a = rows["before"], rows["after"]
    print("| figure | before | after | after ÷ before |\n|---|---:|---:|---:|")
    for key in ("note_batch_ns", "loop_kbatches_s"):
        ratios = [y[key] / x[key] for x, y in zip(b, a)]
        print(f"| {key} | {_med([x[key] for x in b])} | {_med([y[key] for y in a])} | "
              f"{_med(ratios)} |")
    for key in ("snapshot_us", "ring_kb"):
        print(f"| {key} | — | {_med([y[key] for y in a])} | — |")


if __name__ == "__main__":
    main()
