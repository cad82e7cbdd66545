"""Where the parent process spends its time in one `stream` pipeline (cProfile).

    PYTHONPATH=<tree> python -m benchmarks.profile_parent filter [--records 40000] [--top 25]

Runs one of `bench_stream.PIPELINES` (batch, filter, pack) with `async for`, so the event loop
runs on the profiled main thread (with the sync API it runs on a background thread, which
cProfile does not see), and prints the functions with the most own time and the most
cumulative time. The workers are other processes: what shows here is the parent's share
(fetching, unpickling results, collating or packing on the loop thread, idle waiting in the
loop's poll). Run it from a neutral directory (see compare_trees.py) to profile another tree.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

from .bench_pipeline import SHARDS
from .bench_stream import PIPELINES, WORKERS
from .common import DEFAULT_DATA_DIR, aioloader_info, sharded_dataset
from .contenders import run as run_pipeline


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_parent")
    p.add_argument("pipeline", choices=list(PIPELINES))
    p.add_argument("--records", type=int, default=20_000,
                   help="records in the dataset (the `stream --quick` one: 20000)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=WORKERS)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--timer", choices=("cpu", "wall"), default="cpu",
                   help="cpu: the main thread's CPU time (default; robust on a busy machine); "
                        "wall: also counts idle polling and waiting for the GIL")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = p.parse_args()
    paths = sharded_dataset(args, "text", args.records, SHARDS)
    _, extra, _ = PIPELINES[args.pipeline]
    spec = {"lib": "aioloader", "paths": [str(x) for x in paths], "seed": 0,
            "workers": args.workers, "epochs": args.epochs, "api": "async", **extra}
    run_pipeline({**spec, "epochs": 1})  # warm-up: page cache, imports
    prof = cProfile.Profile(time.thread_time if args.timer == "cpu" else time.perf_counter)
    t0, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
    prof.enable()
    out = run_pipeline(spec)
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    main_cpu = time.thread_time() - main0
    records = args.records * args.epochs
    print(f"aioloader: {aioloader_info()}")
    print(f"{args.pipeline}: {records:,} input records, workers={args.workers}, wall {wall:.2f} s"
          f" ({records / wall:,.0f} rec/s under the profiler), parent CPU {cpu:.2f} s "
          f"({1e6 * cpu / records:.1f} µs/record), of which the main (event-loop) thread "
          f"{main_cpu:.2f} s and other threads {cpu - main_cpu:.2f} s; "
          f"{out['records']:,} items out; timer: {args.timer}")
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(args.top)
        print(f"\n== by {key} ==")
        print("\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip()
                        and not ln.lstrip().startswith(("Ordered by", "List reduced"))))


if __name__ == "__main__":
    main()
