"""executor="ray" against executor="processes": records/s, and the loading process's own CPU.

Standalone (not part of `python -m benchmarks run`, which compares with peers). One local Ray
cluster (`ray.init(num_cpus=<workers>)`, started once, as a user would) and the same cached
ArrayRecord files (`benchmarks.common.dataset`, array_record's writer) for both; for each
workload the two executors run in turn, A/B within every round, one epoch each of

- text: 1 KiB JSON records -> `json.loads` -> batch 256 (dicts of ints and strings);
- img: 64 KiB noisy records -> zero-copy (128, 128, 4) uint8 view -> batch 256 (16 MiB);

over `shuffle(seed).map(fn).batch(256)` with the same `workers` and `prefetch`. Reported per
round and as min/median/max of the ratio ray ÷ processes:

- rate: records/s over the whole run (from `ds.loader()` to the last batch: the actors'
  start included) and steady (from the first batch to the last);
- parent CPU per record: `time.process_time()` of this process alone over the run (its
  event loop, the byte path, receiving results; Ray's driver threads included) -- the
  training host's cost of loading when the workers run elsewhere;
- for ray, the time tasks waited from being sent to starting, and from ending to arriving
  (the executor's `figures()`), and the tasks per call to an actor (`--tasks-per-call`: the
  most a call carries, the executor's `tasks_per_call`; the default: its own);
- with `--threads`, the steady parent CPU per record by thread name (each thread's
  `/proc/self/task/<tid>/schedstat` at the first batch and at the last: the event loop,
  the pool's threads, Ray's driver threads), summed over the rounds, and what threads
  that ended before the last batch took (`(ended)`: process time less the threads').

The tree measured is the one `PYTHONPATH` names (the repository this file is in comes
after it): one copy of this file measures two trees in turn.

Run from the repository root with the `ray` extra installed:

    python benchmarks/bench_executors_ray.py --rounds 4
    python benchmarks/bench_executors_ray.py --quick
    PYTHONPATH=<tree> python benchmarks/bench_executors_ray.py --rounds 3 --threads
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path, after
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # PYTHONPATH's tree

from benchmarks import fns
from benchmarks.common import dataset, log, machine_info

WORKLOADS = {"text": ("decode_text", 40_000), "img": ("decode_image", 6_000)}


def thread_cpu() -> dict[int, tuple[str, int]]:
    """This process's threads now: tid -> (name, CPU ns so far); a Python thread by its
    `threading` name, the others (Ray's, the interpreter's) by the kernel's, less a
    trailing number."""
    out = {}
    main = os.getpid()
    named = {t.native_id: f"py:{t.name}" for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:  # (ended meanwhile)
            continue
        name = "main thread" if int(tid) == main else named.get(int(tid), name)
        name = re.sub(r"[-_.]?\d+(_\d+)?$", "", name)
        out[int(tid)] = (name, ns)
    return out


def thread_delta(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]],
                 process_ns: int) -> dict[str, int]:
    """CPU ns by thread name between two `thread_cpu()`s, and `(ended)`: what the process
    took beyond its threads alive at the end (threads that ended in between)."""
    out: collections.Counter[str] = collections.Counter()
    for tid, (name, ns) in after.items():
        out[name] += ns - before.get(tid, (name, 0))[1]
    out["(ended)"] = max(0, process_ns - sum(out.values()))
    return dict(out)


def one_run(path: Path, decode: str, executor: str, workers: int, prefetch: int,
            seed: int, slot_size: int | None = None, tasks_per_call: int | None = None
            ) -> dict[str, Any]:
    import aioloader as al

    kind: Any = executor
    if executor == "ray" and tasks_per_call:
        kind = al.RayExecutor(tasks_per_call=tasks_per_call)

    ds = (al.Dataset.from_arrayrecord(str(path)).shuffle(seed).map(getattr(fns, decode))
          .batch(256))
    t0, cpu0 = time.perf_counter(), time.process_time()
    first = last = cpu_first = 0.0
    threads_first: dict[int, tuple[str, int]] = {}
    records = first_size = 0
    sized = {"slot_size": slot_size} if slot_size else {}
    with ds.loader(workers=workers, prefetch=prefetch, executor=kind, **sized) as it:
        for batch in it:
            last = time.perf_counter()
            value = next(iter(batch.values())) if isinstance(batch, dict) else batch
            records += len(value)
            if not first:
                first, first_size, cpu_first = last, records, time.process_time()
                threads_first = thread_cpu()
        cpu = time.process_time()
        threads = thread_delta(threads_first, thread_cpu(), int((cpu - cpu_first) * 1e9))
        transfers = it.stats().as_dict()["transfers"]
    wall = last - t0
    return {"records": records, "wall": wall, "rate": records / wall,
            "steady": (records - first_size) / (last - first), "ttfb": first - t0,
            "parent_cpu_us": 1e6 * (cpu - cpu0) / records,
            "steady_cpu_us": 1e6 * (cpu - cpu_first) / (records - first_size),
            "transfers": transfers, "threads": threads, "steady_records": records - first_size}


def thread_table(results: dict[str, dict[str, list[dict]]]) -> None:
    """Steady parent CPU µs per record by thread name, each executor's rounds summed."""
    print("\n| workload | thread | processes µs/rec | ray µs/rec |\n|---|---|---:|---:|")
    for name, runs in results.items():
        per: dict[str, dict[str, float]] = {}
        for executor, rounds in runs.items():
            total: collections.Counter[str] = collections.Counter()
            for got in rounds:
                total.update(got["threads"])
            records = sum(got["steady_records"] for got in rounds)
            per[executor] = {k: v / 1e3 / records for k, v in total.items()}
        names = sorted(set(per["processes"]) | set(per["ray"]),
                       key=lambda k: -max(per["processes"].get(k, 0), per["ray"].get(k, 0)))
        for k in [*names, "all"]:
            p, y = ((sum(per[e].values()) if k == "all" else per[e].get(k, 0))
                    for e in ("processes", "ray"))
            if k == "all" or max(p, y) >= 0.05:
                print(f"| {name} | {k} | {p:.2f} | {y:.2f} |")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--workloads", default="text,img")
    parser.add_argument("--quick", action="store_true", help="a quarter of the records")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=None, help="write the rounds as JSON here")
    parser.add_argument("--ray-slot-size", type=int, default=None,
                        help="slot_size for ray only (MiB): how many batches a task groups")
    parser.add_argument("--tasks-per-call", type=int, default=None,
                        help="for ray: the most tasks one call to an actor carries")
    parser.add_argument("--threads", action="store_true",
                        help="also the parent's steady CPU per record by thread name")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    log(machine_info())
    results: dict[str, dict[str, list[dict]]] = {}
    slot_size = args.ray_slot_size << 20 if args.ray_slot_size else None
    try:
        for name in args.workloads.split(","):
            decode, n = WORKLOADS[name]
            n = n // 4 if args.quick else n
            path = dataset(args, name, n)
            runs: dict[str, list[dict]] = {"processes": [], "ray": []}
            for executor in runs:  # warm-up: page cache, the worker server, Ray's workers
                one_run(path, decode, executor, args.workers, args.prefetch, 0,
                        slot_size if executor == "ray" else None, args.tasks_per_call)
            for r in range(args.rounds):
                order = ("processes", "ray") if r % 2 == 0 else ("ray", "processes")
                for executor in order:  # ABBA
                    got = one_run(path, decode, executor, args.workers, args.prefetch, r + 1,
                                  slot_size if executor == "ray" else None,
                                  args.tasks_per_call)
                    runs[executor].append(got)
                    log(f"{name} round {r} {executor}: {got['rate']:,.0f} rec/s, steady "
                        f"{got['steady']:,.0f}, parent {got['parent_cpu_us']:.1f} µs/rec")
            results[name] = runs
    finally:
        ray.shutdown()
    print("| workload | processes k rec/s steady | ray k rec/s steady | ray ÷ processes, "
          "steady | ray ÷ processes, whole run | first batch s, processes / ray | parent "
          "CPU µs/rec steady, processes / ray | ray ÷ processes | whole run | ray wait / "
          "return ms per task | ray tasks per call |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    for name, runs in results.items():
        p, y = runs["processes"], runs["ray"]

        def ratio(key: str, p: list = p, y: list = y) -> str:
            return spread([b[key] / a[key] for a, b in zip(p, y)])

        tasks = [max(1, t["transfers"].get("by_value", 0) + t["transfers"].get("in_slot", 0))
                 for t in y]
        wait = med(t["transfers"]["wait_ms"] / k for t, k in zip(y, tasks))
        back = med(t["transfers"]["return_ms"] / k for t, k in zip(y, tasks))
        per_call = med(k / max(1, t["transfers"].get("calls", k)) for t, k in zip(y, tasks))
        print(f"| {name} | {med(a['steady'] for a in p) / 1e3:.1f} | "
              f"{med(b['steady'] for b in y) / 1e3:.1f} | {ratio('steady')} | "
              f"{ratio('rate')} | {med(a['ttfb'] for a in p):.1f} / "
              f"{med(b['ttfb'] for b in y):.1f} | {med(a['steady_cpu_us'] for a in p):.1f} / "
              f"{med(b['steady_cpu_us'] for b in y):.1f} | {ratio('steady_cpu_us')} | "
              f"{ratio('parent_cpu_us')} | {wait:.1f} / {back:.1f} | {per_call:.2f} |")
    if args.threads:
        thread_table(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
