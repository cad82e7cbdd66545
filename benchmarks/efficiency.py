"""Records per CPU-second of the whole process tree, against the bare per-record loop.

    python -m benchmarks.efficiency [--tree NAME=PATH ...] [--workers 0 1 2] [--rounds 5]
        [--records 200000] [--images 20000] [--only text|img|img-typed] [--data-dir DIR]

What a record costs the machine, whoever pays it (the parent, its event-loop thread, the
worker processes): for each workload, the bare loop (per record: a `preadv` of its chunk into
a reused buffer, the zstd decode of its values block, the transform; one thread, nothing
else: `bench_decode.Limit`) and the pipeline (`shuffle -> map(transform) -> batch(256)`, local
files, 20 shards; `img-typed`: the images read as arrays by the typed decode,
`from_arrayrecord(decode=ElementSpec.array(...))`, in place of the map) at each worker
count, every pipeline in a fresh interpreter. A pipeline's CPU is sampled from inside its
process (`common.cpu_seconds`: the process, its threads and its live worker processes) at
its first batch and at its last, so start-up (spawning and importing in the workers, opening
the files) is left out; the figure is the records after the first batch ÷ those CPU seconds.
The bare loop is timed in CPU seconds of its thread. For the images it is also run with
its batching (`bench_decode.Limit.collated`: each batch's records stacked into one reused
array, the one copy a batch costs that the bare loop skips), and every pipeline is given
over that floor as well: the share of the batching loop's rate that the loader keeps.

Contenders run in turn within each round (bare, then each tree's pipelines; every other
round in the reverse order, ABBA), and each ratio
(pipeline ÷ bare, records per CPU-second) is taken per round, so a loaded machine's drift
hits both sides alike: CPU time is steadier than wall time where other jobs share the cores.
`--tree NAME=PATH` (repeatable) measures several aioloader checkouts side by side in one run
(before/after a change); each pipeline child gets `PYTHONPATH=<a copy of these benchmarks>:
<tree>`, so that both trees run the very same transforms. Without it, the tree these
benchmarks live in is measured.

`child SPEC_JSON` is the pipeline child's entry point (prints one RESULT line).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import DEFAULT_DATA_DIR, cpu_seconds, log, machine_info, sharded_dataset

BATCH = 256
SHARDS = 20
# name -> (data set, the transform, typed: the records read as arrays by the built-in
# typed decode, `from_arrayrecord(decode=ElementSpec.array(...))`, instead of the map)
WORKLOADS = {"text": ("text", "decode_text", False), "img": ("img", "decode_image", False),
             "img-typed": ("img", "decode_image", True)}
HERE = Path(__file__).resolve().parent


# -- the pipeline child ---------------------------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One pipeline, steady state: records and CPU seconds between its first and last batch.

    The last sample is taken when the last batch arrives, before the iterator is asked for
    more: at the end of the epoch the pool lets its workers go, and the CPU time of a worker
    that exited is not seen until its parent (the forkserver) reaps it."""
    import aioloader as al

    from . import fns

    if spec.get("typed"):  # the same arrays as the map gives, by the typed decode
        import numpy as np

        ds = (al.Dataset.from_arrayrecord(
            spec["paths"], decode=al.ElementSpec.array(np.uint8, fns.IMAGE_SHAPE))
            .shuffle(spec.get("seed", 0)).batch(BATCH))
    else:
        ds = (al.Dataset.from_arrayrecord(spec["paths"]).shuffle(spec.get("seed", 0))
              .map(getattr(fns, spec["decode"])).batch(BATCH))
    cpu_start = cpu_seconds()
    records = 0
    first_cpu = first_wall = 0.0
    first_records = 0
    end_cpu = end_wall = 0.0
    with ds.loader(workers=spec["workers"]) as it:
        for batch in it:
            size = len(next(iter(batch.values())) if isinstance(batch, dict) else batch)
            records += size
            if not first_records:
                first_cpu, first_wall, first_records = cpu_seconds(), time.perf_counter(), size
            if records == spec["total"]:  # the last batch: sampled while the workers live
                end_cpu, end_wall = cpu_seconds(), time.perf_counter()
    if records != spec["total"]:
        raise RuntimeError(f"{records} records, expected {spec['total']}")
    return {"records": records - first_records, "cpu": end_cpu - first_cpu,
            "wall": end_wall - first_wall, "all_cpu": end_cpu - cpu_start,
            "all_records": records}


def run_child(tree: Path, neutral: Path, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{neutral}{os.pathsep}{tree}"
    env.pop("PYTHONSAFEPATH", None)
    out = subprocess.run([sys.executable, "-m", "benchmarks.efficiency", "child",
                          json.dumps(spec)], cwd=neutral, env=env, capture_output=True,
                         text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{tree}: {spec['decode']} workers={spec['workers']} failed: "
                           f"{out.stderr.strip()[-800:]}")
    return json.loads(lines[-1][len("RESULT "):])


# -- the bare loop --------------------------------------------------------------------------


def bare(paths: list[str], decode: str, batched: bool = False) -> tuple[int, float]:
    """Records and CPU seconds of the bare loop over one shuffled epoch, batch by batch.
    `batched` (images): each batch's records also stacked into one reused batch array, the
    one copy that batching costs (`bench_decode.Limit.collated`)."""
    from . import fns
    from .bench_decode import Limit, _batches

    _, batches, n = _batches(paths)
    limit = Limit(paths)
    fn = getattr(fns, decode)
    t0 = time.process_time()
    for refs in batches:
        out = limit.collated(refs) if batched else [fn(r) for r in limit.records(refs)]
    del out
    cpu = time.process_time() - t0
    for fd in limit.fds.values():
        os.close(fd)
    return n, cpu


# -- the table ------------------------------------------------------------------------------


def round_order(trees: list[str], workers: list[int], rnd: int, floor: bool = False
                ) -> list[Any]:
    """The runs of round `rnd`, in turn: the bare loop (and with `floor` the bare loop that
    also batches), then each tree's pipelines at each worker count; every other round in
    reverse (ABBA), so that a drift of the machine's load within a round does not always
    favour the same side of a pair."""
    runs: list[Any] = ["bare", *(["floor"] if floor else []),
                       *((name, w) for name in trees for w in workers)]
    return runs if rnd % 2 == 0 else runs[::-1]


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}–{max(xs):.2f}]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        res = child(json.loads(argv[1]))
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.efficiency")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--records", type=int, default=200_000, help="text records (20 shards)")
    p.add_argument("--images", type=int, default=20_000, help="image records (20 shards)")
    p.add_argument("--only", action="append", choices=list(WORKLOADS))
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree) or {"tree": str(HERE.parent)}
    neutral = Path(tempfile.mkdtemp(prefix="aioloader-efficiency-"))
    shutil.copytree(HERE, neutral / "benchmarks",
                    ignore=shutil.ignore_patterns("data", "__pycache__", "*.png"))
    sizes = {"text": args.records, "img": args.images}
    loads: list[float] = []
    # per workload: "bare" -> [rec/CPU-s], (tree, workers) -> [rec/CPU-s], and per round ratios
    rates: dict[str, dict[Any, list[float]]] = {}
    ratios: dict[str, dict[Any, list[float]]] = {}
    whole: dict[str, dict[Any, list[float]]] = {}
    floors: dict[str, dict[Any, list[float]]] = {}  # ÷ the bare loop that batches (images)
    try:
        for kind in args.only or list(WORKLOADS):
            data, decode, typed = WORKLOADS[kind]
            paths = [str(x) for x in sharded_dataset(args, data, sizes[data], SHARDS)]
            rates[kind], ratios[kind], whole[kind], floors[kind] = {}, {}, {}, {}
            bare(paths, decode)  # warm-up: page cache, allocator
            for rnd in range(args.rounds):
                got: dict[Any, dict[str, Any]] = {}
                for who in round_order(list(trees), args.workers, rnd, data == "img"):
                    if who in ("bare", "floor"):
                        n, cpu = bare(paths, decode, batched=who == "floor")
                        got[who] = {"rate": n / cpu}
                        continue
                    name, w = who
                    spec = {"paths": paths, "decode": decode, "workers": w, "seed": 0,
                            "total": sizes[data], "typed": typed}
                    got[who] = run_child(Path(trees[name]), neutral, spec)
                base = got["bare"]["rate"]
                rates[kind].setdefault("bare", []).append(base)
                if "floor" in got:
                    rates[kind].setdefault("floor", []).append(got["floor"]["rate"])
                for name in trees:
                    for w in args.workers:
                        r = got[(name, w)]
                        rate = r["records"] / r["cpu"]
                        rates[kind].setdefault((name, w), []).append(rate)
                        ratios[kind].setdefault((name, w), []).append(rate / base)
                        if "floor" in got:
                            floors[kind].setdefault((name, w), []).append(
                                rate / got["floor"]["rate"])
                        whole[kind].setdefault((name, w), []).append(
                            r["all_records"] / r["all_cpu"] / base)
                loads.append(os.getloadavg()[0])
                log(f"{kind} round {rnd + 1}: bare {base:,.0f} rec/CPU-s; " + ", ".join(
                    f"{name} w{w} {ratios[kind][(name, w)][-1]:.2f}"
                    for name in trees for w in args.workers))
    finally:
        shutil.rmtree(neutral, ignore_errors=True)
    print(f"Machine: {machine_info()}; 1-min load average during the run "
          f"{min(loads):.1f}–{max(loads):.1f} ({os.cpu_count()} cores)\n")
    first = next(iter(trees))
    print("| workload | tree | workers | rec per CPU-s (steady) | ÷ bare loop, per round | "
          f"÷ bare loop that batches, per round | ÷ bare, start-up incl. | ÷ {first}, per "
          "round |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for kind in rates:
        b = rates[kind]["bare"]
        print(f"| {kind} | bare loop | — | {statistics.median(b):,.0f} | 1 | — | — | — |")
        if "floor" in rates[kind]:
            lo = [f / z for f, z in zip(rates[kind]["floor"], b)]
            print(f"| {kind} | bare loop that batches | — | "
                  f"{statistics.median(rates[kind]['floor']):,.0f} | {_fmt(lo)} | 1 | — | — |")
        for name in trees:
            for w in args.workers:
                versus = [a / z for a, z in zip(rates[kind][(name, w)],
                                                rates[kind][(first, w)])]
                fl = floors[kind].get((name, w))
                print(f"| {kind} | {name} | {w} | "
                      f"{statistics.median(rates[kind][(name, w)]):,.0f} | "
                      f"**{_fmt(ratios[kind][(name, w)])}** | "
                      f"{_fmt(fl) if fl else '—'} | "
                      f"{_fmt(whole[kind][(name, w)])} | {_fmt(versus)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
