"""The large-group cliff (issue 15, section 4): block shuffle over one 1M-record file written
with group_size 65536 (16 chunks of 64 MiB decoded), rate and peak RSS, two trees ABBA.

    python -m benchmarks.block_cliff --before /work/wt-blocks-base --after . [--seconds 20]

Each run is its own process (`run` subcommand) on one tree: it reads the block-shuffled
file with workers=1, batch 256, for `--seconds`, and prints records/s and the peak RSS of
the process and its worker. The old tree's block shuffle is `window=16` chunks (its
default: the whole file); the new one's is the defaults (4 MiB blocks, 64 MiB windows).
"""

from __future__ import annotations

import argparse
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


def run(path: str, seconds: float, mode: str) -> None:
    import aioloader as al

    ds = al.Dataset.from_arrayrecord(path)
    if mode == "block":
        old = "window" in inspect.signature(al.Dataset.shuffle).parameters and \
            "window_bytes" not in inspect.signature(al.Dataset.shuffle).parameters
        ds = ds.shuffle(0, strategy="block", **({"window": 16} if old else {}))
    else:
        ds = ds.shuffle(0)
    ds = ds.batch(256)
    n = 0
    t0 = time.perf_counter()
    with ds.loader(workers=1) as it:
        for b in it:
            n += len(b)
            if time.perf_counter() - t0 > seconds:
                break
        dt = time.perf_counter() - t0
        kids = sum(_hwm_mb(pid) for pid in _children())
    print(json.dumps({"rate": n / dt, "rss_mb": _hwm_mb("self"), "worker_rss_mb": kids}))
    # worker_rss_mb: the peak RSS of every descendant (worker, fork server), summed


def _hwm_mb(pid) -> float:
    """Peak RSS (VmHWM) in MB; unlike ru_maxrss it is not inherited across fork + exec."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid="self") -> list[int]:
    """Every descendant process (workers may be grandchildren, under a fork server)."""
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                out += [int(child), *_children(int(child))]
    except OSError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", nargs="?", default="compare")
    ap.add_argument("--path", default="/tmp/aioloader-cliff/text-1M-g65536.array_record")
    ap.add_argument("--before", default="")
    ap.add_argument("--after", default=".")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--mode", default="block")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.path, a.seconds, a.mode)
        return
    Path(a.path).parent.mkdir(parents=True, exist_ok=True)
    write(Path(a.path))
    trees = {"before": a.before, "after": a.after}
    res: dict[str, list[dict]] = {k: [] for k in trees}
    order = [k for r in range(a.reps) for k in (("before", "after") if r % 2 == 0
                                                   else ("after", "before"))]
    for name in order:
        tree = os.path.abspath(trees[name])
        out = subprocess.run([sys.executable, "-m", "benchmarks.block_cliff", "run",
                              "--path", a.path, "--seconds", str(a.seconds), "--mode", a.mode],
                             cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                             capture_output=True, text=True, check=True)
        res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(name, res[name][-1], flush=True)
    for name, rs in res.items():
        rates = [r["rate"] for r in rs]
        print(f"{name}: {statistics.median(rates):,.0f} rec/s [{min(rates):,.0f}–"
              f"{max(rates):,.0f}], peak RSS parent {max(r['rss_mb'] for r in rs):.0f} MB, "
              f"worker {max(r['worker_rss_mb'] for r in rs):.0f} MB")


if __name__ == "__main__":
    main()
