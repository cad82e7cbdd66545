"""Time to first batch from a bucket in a fresh process, in round trips (issue 15).

Usage: PYTHONPATH=. [AIOLOADER_GCS_CLIENT=curl|aiohttp] [LAT=30] [REPS=3] [PREIMPORT=1] \
    [TREES=before=/work/wt-x,after=.] python benchmarks/first_batch_rtt.py

20 shards of 1,000 ~1 KiB JSON records (group_size 1) in the emulator behind the delay line
at LAT ms fixed (no jitter). A child process imports aioloader (not timed), then opens the
dataset three ways (a glob, one named file, 20 named files) and takes one shuffled batch of
256 with workers=0, io_concurrency=256, resident_bytes=0 (record by record). Reported: wall
(gcsfs/aiohttp imports included unless PREIMPORT=1), wall / latency ("RTT"), the requests and
connections the delay line saw, and whether gcsfs / aiohttp were imported at all.

The issue's target is "≤ 4 round trips + one batch": the child then takes 8 more batches and
reports one batch at that steady rate (`batch`), and the first batch less one such batch, in
round trips (`beyond`), measured in the same process on the same machine load. `TREES` runs
the child on each named tree in turn (ABAB) against the same emulator and delay line.
`PIN=1` puts the emulator and the delay line on the last core and the child on the others:
on a real bucket the server's CPU is not the client's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from aioloader.testing import local_gcs

CHILD = r'''
import itertools, os, sys, time, json
import aioloader
if os.environ.get("PREIMPORT"):
    import gcsfs, aiohttp
t0 = time.perf_counter()
spec = json.loads(sys.argv[1])
ds = aioloader.Dataset.from_arrayrecord(spec["paths"], storage_options=spec["opts"])
it = iter(ds.shuffle(0).batch(256).loader(workers=0, io_concurrency=256, resident_bytes=0))
next(it)
wall = time.perf_counter() - t0
more = sum(1 for _ in itertools.islice(it, 8))  # one file holds 3 more batches
batch = (time.perf_counter() - t0 - wall) / more
print(json.dumps({"wall": wall, "batch": batch, "gcsfs": "gcsfs" in sys.modules,
                  "aiohttp": "aiohttp" in sys.modules}))
os._exit(0)
'''


def shards(folder: Path) -> list[Path]:
    from array_record.python.array_record_module import ArrayRecordWriter

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(20):
        p = folder / f"t-{k:02d}.array_record"
        if not p.exists():
            w = ArrayRecordWriter(str(p), "group_size:1,zstd:3")
            for i in range(1000):
                w.write(json.dumps({"i": i, "t": "x" * 900}).encode())
            w.close()
        paths.append(p)
    return paths


def main() -> None:
    root = Path(__file__).resolve().parents[1]
    paths = shards(Path(os.environ.get("DATA", "/tmp/aioloader-rtt-data")))
    lat = float(os.environ.get("LAT", "30"))
    client = os.environ.get("AIOLOADER_GCS_CLIENT", "auto")
    with local_gcs(latency_ms=lat, proxy_process=True) as gcs:
        urls = [gcs.upload(p, f"text/{p.name}") for p in paths]
        cores = sorted(os.sched_getaffinity(0))
        client_cores = cores
        if os.environ.get("PIN") and len(cores) > 1:
            import psutil

            for p in psutil.Process().children(recursive=True):  # the emulator, the delay line
                p.cpu_affinity(cores[-1:])
            client_cores = cores[:-1]
        trees = [t.split("=", 1) for t in os.environ.get("TREES", f"tree={root}").split(",")]
        for _, tree in trees:  # as installed: this machine sets PYTHONDONTWRITEBYTECODE, so
            # an editable tree's stale modules would be compiled again in every child
            subprocess.run([sys.executable, "-m", "compileall", "-q",
                            str(Path(tree) / "aioloader")], check=True)
        for what, spec in (("glob", gcs.url("text/*.array_record")), ("one file", urls[0]),
                           ("20 urls", urls)):
            for _ in range(int(os.environ.get("REPS", "3"))):
                for name, tree in trees:
                    before = gcs.proxy_stats
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD,
                         json.dumps({"paths": spec, "opts": gcs.storage_options})],
                        env={**os.environ, "PYTHONPATH": str(Path(tree).resolve())},
                        capture_output=True, text=True, cwd=root, check=True,
                        preexec_fn=lambda: os.sched_setaffinity(0, client_cores))
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    after = gcs.proxy_stats
                    s = lat / 1e3 if lat else float("nan")
                    print(f"{name:7} {client:5} {what:9} first {r['wall']:.3f} s = "
                          f"{r['wall'] / s:.1f} RTT  batch {r['batch']:.3f} s  beyond "
                          f"{(r['wall'] - r['batch']) / s:.1f} RTT  requests "
                          f"{after.requests - before.requests} connections "
                          f"{after.connections - before.connections}  gcsfs={r['gcsfs']} "
                          f"aiohttp={r['aiohttp']}", flush=True)


if __name__ == "__main__":
    main()
