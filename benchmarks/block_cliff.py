"""The large-group cliff (issue 15, section 4): block shuffle over one 1M-record file written
with group_size 65536 (16 chunks of 64 MiB decoded), rate and peak RSS, two trees ABBA.

    python -m benchmarks.block_cliff --before /work/wt-blocks-base --after . [--seconds 20]
        [--modes exact,block,seq] [--workers 1] [--reps 2]

Each run is its own process (`run` subcommand) on one tree: it reads the file with
workers=1 (`--workers`), batch 256, for `--seconds` (or one epoch), exactly shuffled
(`exact`), block-shuffled (`block`) or in order (`seq`), and prints records/s, CPU
microseconds per record (the process and its workers) and the peak PSS summed over the
process and its workers (found through the loader's pool: under a fork server they are not
its children). The old tree's block shuffle is `window=16` chunks (its default: the whole
file); the new one's is the defaults (4 MiB blocks, 64 MiB windows). Rows print as a
markdown table: mode | tree | rec/s median [range] | CPU µs/record | peak PSS MB | first s.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

N = 1 << 20
GROUP = 65536


def write(path: Path) -> None:
    import aioloader as al
    from benchmarks.common import text_records

    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    with al.ArrayRecordWriter(tmp, group_size=GROUP) as w:
        for r in text_records(N):
            w.write(r)
    os.replace(tmp, path)


def run(path: str, seconds: float, mode: str, workers: int = 1) -> None:
    import threading

    import psutil

    import aioloader as al

    ds = al.Dataset.from_arrayrecord(path)
    if mode == "block":
        old = "window" in inspect.signature(al.Dataset.shuffle).parameters and \
            "window_bytes" not in inspect.signature(al.Dataset.shuffle).parameters
        ds = ds.shuffle(0, strategy="block", **({"window": 16} if old else {}))
    elif mode == "exact":
        ds = ds.shuffle(0)
    ds = ds.batch(256)
    it = ds.loader(workers=workers)
    peak = {"pss": 0.0}
    done = threading.Event()
    cpu: dict[int, float] = {}  # each process's last CPU seconds seen

    def procs() -> list:
        pool = getattr(it, "pool", None)
        kids = list(getattr(pool, "_procs", None) or []) or list(
            (getattr(getattr(pool, "_executor", None), "_processes", None) or {}).values())
        out = [psutil.Process()]
        for p in kids:
            with contextlib.suppress(Exception):
                out.append(psutil.Process(p.pid))
        return out

    def poll() -> None:  # PSS summed over this process and its workers (they share pages)
        while not done.is_set():
            total = 0
            for p in procs():
                with contextlib.suppress(Exception):
                    total += p.memory_full_info().pss
                    t = p.cpu_times()
                    cpu[p.pid] = t.user + t.system
            peak["pss"] = max(peak["pss"], total / 2**20)
            done.wait(0.1)

    watcher = threading.Thread(target=poll, daemon=True)
    n = 0
    t0 = time.perf_counter()
    first = None
    with it:
        watcher.start()
        for b in it:
            first = time.perf_counter() - t0 if first is None else first
            n += len(b)
            if time.perf_counter() - t0 > seconds:
                break
        dt = time.perf_counter() - t0
        done.set()
        watcher.join()
        for p in procs():  # the final CPU figures, before the workers go
            with contextlib.suppress(Exception):
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
    print(json.dumps({"rate": n / dt, "records": n, "first_s": first,
                      "pss_mb": peak["pss"], "cpu_us": 1e6 * sum(cpu.values()) / max(n, 1)}))
    # pss_mb: peak of the PSS summed over this process and its workers, sampled every
    # 0.1 s; cpu_us: their CPU seconds (open and first decodes included) per record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", nargs="?", default="compare")
    ap.add_argument("--path", default="/tmp/aioloader-cliff/text-1M-g65536.array_record")
    ap.add_argument("--before", default="")
    ap.add_argument("--after", default=".")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--modes", default="block", help="comma-separated: exact, block, seq")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.path, a.seconds, a.modes, a.workers)
        return
    Path(a.path).parent.mkdir(parents=True, exist_ok=True)
    write(Path(a.path))
    trees = {"before": a.before, "after": a.after}
    for mode in a.modes.split(","):
        res: dict[str, list[dict]] = {k: [] for k in trees}
        order = [k for r in range(a.reps) for k in (("before", "after") if r % 2 == 0
                                                       else ("after", "before"))]
        for name in order:
            tree = os.path.abspath(trees[name])
            # This script (not the tree's copy) runs each tree's aioloader, so that both
            # are measured the same way.
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "run",
                                  "--path", a.path, "--seconds", str(a.seconds),
                                  "--modes", mode, "--workers", str(a.workers)],
                                 cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                                 capture_output=True, text=True, check=True)
            res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(mode, name, res[name][-1], flush=True)
        for name, rs in res.items():
            rates = [r["rate"] for r in rs]
            cpu = [r["cpu_us"] for r in rs]
            print(f"| {mode} | {name} | {statistics.median(rates):,.0f} "
                  f"[{min(rates):,.0f}–{max(rates):,.0f}] | {statistics.median(cpu):,.1f} "
                  f"[{min(cpu):,.1f}–{max(cpu):,.1f}] | {max(r['pss_mb'] for r in rs):,.0f} | "
                  f"{statistics.median(r['first_s'] or 0 for r in rs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
