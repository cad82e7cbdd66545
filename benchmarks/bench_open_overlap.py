"""gcsfs's import overlapped with start-up (issue 15): a gs:// glob named in a pipeline,
then `--startup` seconds of the program's own start-up (slept: waiting on a device or the
network, which leaves the GIL free), then the loader's first batch. Prints the wall time
from the end of start-up to the first batch (the open and one batch), one fresh process
per run, trees alternating (ABBA).

    python benchmarks/bench_open_overlap.py --tree before=/work/wt-a --tree after=/work/wt-b
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(url: str, options: dict, startup: float) -> dict:
    import aioloader as al

    ds = al.Dataset.from_arrayrecord(url, storage_options=options)
    time.sleep(startup)  # the program's own start-up
    imported = "gcsfs" in sys.modules
    t = time.perf_counter()
    it = iter(ds.batch(32).loader(workers=0))
    next(it)
    wall = time.perf_counter() - t
    return {"wall": wall, "gcsfs_before_open": imported}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[])
    ap.add_argument("--data", default="/tmp/bench_open/shards-100/part-*.array_record")
    ap.add_argument("--startup", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["url"], spec["options"], spec["startup"])))
        return
    from aioloader.testing import local_gcs

    trees = [t.split("=", 1) for t in args.tree]
    out: dict[str, list[float]] = {}
    with local_gcs(proxy_process=True) as gcs:
        for p in sorted(glob.glob(args.data)):
            gcs.upload(p, f"overlap/{Path(p).name}")
        spec = {"url": gcs.url("overlap/part-*.array_record"),
                "options": gcs.storage_options, "startup": args.startup}
        for r in range(args.rounds):
            for name, tree in (trees if r % 2 == 0 else trees[::-1]):
                env = dict(os.environ, PYTHONPATH=tree)
                res = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                                     env=env, capture_output=True, text=True, check=True)
                got = json.loads(res.stdout.strip().splitlines()[-1])
                out.setdefault(name, []).append(got["wall"])
                print(name, got, file=sys.stderr)
    for name, xs in out.items():
        print(f"| {name} | {statistics.median(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}] |")


if __name__ == "__main__":
    main()
