"""Threads against processes: the same pipeline on `executor="threads"` and on
`executor="processes"`, side by side in one run.

Workloads (global shuffle → map → batch 256 from local files, 20 shards; `benchmarks.fns`):
- `text`: 1 KiB JSON records, `json.loads` (pure Python: holds the GIL);
- `img`: 64 KiB raw images, a zero-copy `np.frombuffer(...).reshape` (the work is reading,
  decompressing and stacking the batch);
- `augment`: the same images through float NumPy work (`augment_image`: gamma, mirror,
  contrast; NumPy releases the GIL in each loop).

For each workload and worker count (1 and 2), every round runs the two executors in turn, the
order flipped each round, each in a fresh interpreter (`benchmarks.contenders`): records/s,
records/s after the first batch (the workers up), the time to the first batch, CPU seconds
per record (the whole run: the child and its worker processes), and the peak PSS of the child's
process tree (sampled every 20 ms; PSS splits shared pages among the processes that map
them, so the shared-memory slots count once). The ratios threads ÷ processes are taken per
round and reported as median [min–max]: > 1 means threads are faster (records/s), cost more
CPU per record, or more memory.

`--slot-vs-value` adds an in-process A/B of the threads executor's two ways to hand a batch
back: stacked in an arena slot and lent (what it does), or built by value.

`python -m benchmarks.bench_executors [--quick] [--rounds N] [--slot-vs-value]`
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from .bench_pipeline import run_child
from .common import data_dir, log, machine_info, sharded_dataset

SHARDS = 20
BATCH = 256
EXECUTORS = ("processes", "threads")
WORKERS = (1, 2)


def sizes(quick: bool) -> dict[str, int]:
    """Records per run: a run takes a few seconds on one core."""
    if quick:
        return {"text": 20_000, "img": 2_000, "augment": 512}
    return {"text": 60_000, "img": 4_000, "augment": 1_536}


def workloads(args: Any) -> dict[str, tuple[list[str], str, int]]:
    """name -> (paths, decode function in `benchmarks.fns`, records per run)."""
    n = sizes(args.quick)
    text = [str(p) for p in sharded_dataset(args, "text", n["text"], SHARDS)]
    img = [str(p) for p in sharded_dataset(args, "img", n["img"], SHARDS)]
    return {"text": (text, "decode_text", n["text"]), "img": (img, "decode_image", n["img"]),
            "augment": (img, "augment_image", n["augment"])}


def spec(paths: list[str], decode: str, limit: int, executor: str, workers: int
         ) -> dict[str, Any]:
    return {"lib": "aioloader", "paths": paths, "decode": decode, "seed": 0,
            "shuffle": "exact", "limit": limit, "batch": BATCH, "workers": workers,
            "executor": executor, "prefetch": 4}


def one(s: dict[str, Any]) -> dict[str, float]:
    out = run_child(s, sample_rss=True, pss=True)
    steady = out["wall"] - out["ttfb"]  # after the first batch: the workers are up
    return {"rate": out["records"] / out["wall"], "cpu": out["cpu"] / out["records"],
            "pss": out["peak_rss"], "ttfb": out["ttfb"],
            "steady": (out["records"] - out["first_size"]) / steady if steady > 0 else 0.0}


def measure(args: Any) -> dict[tuple[str, int], dict[str, list[dict[str, float]]]]:
    """Every (workload, workers) pair's runs, by executor, one per round, A/B in turn."""
    loads = workloads(args)
    results: dict[tuple[str, int], dict[str, list[dict[str, float]]]] = {
        (w, k): {e: [] for e in EXECUTORS} for w in loads for k in WORKERS}
    for r in range(args.rounds):
        order = EXECUTORS if r % 2 == 0 else EXECUTORS[::-1]
        for (name, workers), runs in results.items():
            paths, decode, limit = loads[name]
            for executor in order:
                got = one(spec(paths, decode, limit, executor, workers))
                runs[executor].append(got)
                log(f"round {r + 1}/{args.rounds} {name} workers={workers} {executor}: "
                    f"{got['rate']:,.0f} rec/s, {got['cpu'] * 1e6:.0f} us CPU/rec, "
                    f"peak PSS {got['pss'] / 2**20:.0f} MiB")
    return results


def _ratio(a: list[float], b: list[float]) -> str:
    r = sorted(x / y for x, y in zip(a, b, strict=True))
    return f"**{statistics.median(r):.2f}×** [{r[0]:.2f}–{r[-1]:.2f}]"


def table(results: dict[tuple[str, int], dict[str, list[dict[str, float]]]]) -> str:
    lines = ["| workload | workers | records/s threads / processes (medians) | records/s "
             "threads ÷ processes | after the first batch | first batch s threads / "
             "processes | CPU-s per record threads ÷ processes | peak PSS threads / processes "
             "(MiB) | peak PSS threads ÷ processes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, workers), runs in results.items():
        t, p = runs["threads"], runs["processes"]

        def col(runs: list[dict[str, float]], key: str) -> list[float]:
            return [x[key] for x in runs]

        med = statistics.median
        lines.append(
            f"| {name} | {workers} | {med(col(t, 'rate')):,.0f} / {med(col(p, 'rate')):,.0f} "
            f"| {_ratio(col(t, 'rate'), col(p, 'rate'))} "
            f"| {_ratio(col(t, 'steady'), col(p, 'steady'))} "
            f"| {med(col(t, 'ttfb')):.2f} / {med(col(p, 'ttfb')):.2f} "
            f"| {_ratio(col(t, 'cpu'), col(p, 'cpu'))} "
            f"| {med(col(t, 'pss')) / 2**20:.0f} / {med(col(p, 'pss')) / 2**20:.0f} "
            f"| {_ratio(col(t, 'pss'), col(p, 'pss'))} |")
    return "\n".join(lines)


def slot_vs_value(args: Any) -> str:
    """The threads executor's batches stacked in arena slots and lent, against built by
    value, in this process (A/B in turn): images, workers 2."""
    import aioloader as al
    from aioloader.workers.threads import Threads, ThreadsKind

    from . import fns

    class ByValue(Threads):  # the same threads, the output built by value
        def _submit(self, task: Any, slot: int, describe: str, route: Any) -> Any:
            return self._threads.submit(self._run_here, task, None, label=describe), False

    class ByValueKind(ThreadsKind):
        def open(self, pipeline: Any, workers: int, *, slots: int, slot_size: int,
                 lanes: int | None, first_in_parent: bool) -> Threads:
            return ByValue(pipeline, workers, slots=slots, slot_size=slot_size, lanes=lanes)

    paths, _, n = workloads(args)["img"]
    ds = (al.Dataset.from_arrayrecord(paths).shuffle(1)[:n].repeat(3).map(fns.decode_image)
          .batch(BATCH))  # (three epochs: every slot is reused many times)
    kinds = {"slot": "threads", "value": ByValueKind()}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for r in range(args.rounds + 1):  # the first round warms up
        for name in (kinds if r % 2 == 0 else list(kinds)[::-1]):
            t0, c0, records = time.perf_counter(), time.process_time(), 0
            with ds.loader(workers=2, executor=kinds[name]) as it:
                for batch in it:
                    records += len(batch)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if r:
                got[name].append((records / wall, cpu / records))
    rate = _ratio([x[0] for x in got["value"]], [x[0] for x in got["slot"]])
    cpu = _ratio([x[1] for x in got["value"]], [x[1] for x in got["slot"]])
    return ("| threads, img, workers 2 | records/s by value ÷ in slot | CPU-s per record by "
            "value ÷ in slot |\n|---|---:|---:|\n" f"| {args.rounds} rounds | {rate} | {cpu} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_executors",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="A/B rounds (default 5)")
    parser.add_argument("--slot-vs-value", action="store_true",
                        help="also compare batches in slots with batches by value")
    parser.add_argument("--only-slot-vs-value", action="store_true",
                        help="only that comparison")
    parser.add_argument("--data-dir", default=None, help="where datasets are cached")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    data_dir(args)
    print(f"Machine: {machine_info()}\n")
    if not args.only_slot_vs_value:
        print(table(measure(args)))
    if args.slot_vs_value or args.only_slot_vs_value:
        print()
        print(slot_vs_value(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
