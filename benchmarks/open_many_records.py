"""Opening one file of many 8-byte records (group_size 1): time, CPU and peak RSS per tree.

    python benchmarks/open_many_records.py --data-dir /tmp/manyrecords \\
        --tree before=/tmp/base --tree after=/work/wt --records 1000000 5000000 --rounds 2

Each open is a fresh process (`--child`) that first opens a 1,000-record file (imports, the
event loop and thread pools warm), then opens the big one and reads `len()`. It reports the
open's wall and CPU seconds, the process's peak RSS above its RSS before the open
(ru_maxrss), and the RSS kept after it. Trees alternate ABBA by round. Files are written once
(array_record's writer, `group_size:1,uncompressed`); above 10M records the storage's byte
budget is raised to 2 GiB (the default refuses a footer that large).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(path: str, warm: str) -> dict:
    import aioloader as al
    from aioloader.io.storage import Storage

    al.ArrayRecordSource(warm)[0]
    big = os.path.getsize(path) > 600 << 20
    kw = {"storage": Storage(max_inflight_bytes=2 << 30)} if big else {}
    r0, c0, t = _rss(), time.process_time(), time.perf_counter()
    src = al.ArrayRecordSource(path, **kw)
    n = len(src)
    wall, cpu = time.perf_counter() - t, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"n": n, "wall": wall, "cpu": cpu, "peak_mb": (peak - r0) / 1e6,
            "kept_mb": (_rss() - r0) / 1e6}


def write(path: str, n: int) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    if os.path.exists(path):
        return
    w = ArrayRecordWriter(path + ".tmp", "group_size:1,uncompressed")
    for i in range(n):
        w.write(i.to_bytes(8, "little"))
    w.close()
    os.replace(path + ".tmp", path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--records", type=int, nargs="+", default=[1_000_000, 5_000_000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    os.makedirs(args.data_dir, exist_ok=True)
    warm = os.path.join(args.data_dir, "warm.ar")
    write(warm, 1000)
    trees = [t.split("=", 1) for t in args.tree]
    for n in args.records:
        path = os.path.join(args.data_dir, f"one-{n}.ar")
        write(path, n)
        for r in range(args.rounds):
            for name, tree in (trees if r % 2 == 0 else trees[::-1]):
                env = dict(os.environ, PYTHONPATH=tree)
                out = subprocess.run([sys.executable, __file__, "--data-dir", args.data_dir,
                                      "--tree", "x=y", "--child", path, warm], env=env,
                                     capture_output=True, text=True, check=True).stdout
                got = json.loads(out.splitlines()[-1])
                print(f"{n:>10} round {r + 1} {name:>8}: open {got['wall']:.3f} s, "
                      f"{got['cpu']:.3f} CPU-s, peak +{got['peak_mb']:.1f} MB, "
                      f"kept {got['kept_mb']:.1f} MB", flush=True)


if __name__ == "__main__":
    main()
