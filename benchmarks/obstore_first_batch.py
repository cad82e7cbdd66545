"""First batch from 20 files in a bucket, libcurl vs obstore under aioloader's `Storage`.

Usage: PYTHONPATH=. [LAT=30] [REPS=4] python benchmarks/obstore_first_batch.py

`first_batch_rtt.py`'s child (20 named shards of 1,000 ~1 KiB records in the emulator behind
the delay line at LAT ms, workers=0, io_concurrency=256, record by record, one shuffled batch
of 256, then 8 more for the steady rate), run in a fresh process per try, the client
alternating (curl, obstore, obstore, curl, ...): `curl` is the stock backend, `obstore` the
same process with `benchmarks.obstore_backend.install()` first (needs pip install obstore).
Reported per try: wall to the first batch, the steady batch, and the child's CPU seconds
(user + system, imports excluded) to the first batch and for the 8 more.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from aioloader.testing import local_gcs
from benchmarks.first_batch_rtt import shards

CHILD = r'''
import itertools, os, sys, time, json
import aioloader
import pycurl
if sys.argv[2] == "obstore":
    from benchmarks.obstore_backend import install
    install()
def cpu():
    t = os.times()
    return t.user + t.system
c0, t0 = cpu(), time.perf_counter()
spec = json.loads(sys.argv[1])
ds = aioloader.Dataset.from_arrayrecord(spec["paths"], storage_options=spec["opts"])
it = iter(ds.shuffle(0).batch(256).loader(workers=0, io_concurrency=256, resident_bytes=0))
next(it)
wall, c1 = time.perf_counter() - t0, cpu()
more = sum(1 for _ in itertools.islice(it, 8))
batch = (time.perf_counter() - t0 - wall) / more
import benchmarks.obstore_backend as ob
assert (ob.MADE > 0) == (sys.argv[2] == "obstore"), "the wrong client served the reads"
print(json.dumps({"wall": wall, "batch": batch, "cpu_first": c1 - c0,
                  "cpu_more": cpu() - c1}))
os._exit(0)
'''


def main() -> None:
    root = Path(__file__).resolve().parents[1]
    paths = shards(Path(os.environ.get("DATA", "/tmp/aioloader-rtt-data")))
    lat = float(os.environ.get("LAT", "30"))
    reps = int(os.environ.get("REPS", "4"))
    got: dict[str, list[dict]] = {"curl": [], "obstore": []}
    with local_gcs(latency_ms=lat, proxy_process=True) as gcs:
        urls = [gcs.upload(p, f"text/{p.name}") for p in paths]
        for rep in range(reps):
            for client in (("curl", "obstore") if rep % 2 == 0 else ("obstore", "curl")):
                before = gcs.proxy_stats
                out = subprocess.run(
                    [sys.executable, "-c", CHILD,
                     json.dumps({"paths": urls, "opts": gcs.storage_options}), client],
                    env={**os.environ, "PYTHONPATH": str(root),
                         "OBSTORE_GCS_HOST": gcs.server_endpoint.split("//")[1]}, cwd=root,
                    capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"{client} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                after = gcs.proxy_stats
                r["requests"] = after.requests - before.requests
                r["connections"] = after.connections - before.connections
                got[client].append(r)
                print(f"{client:8} first {r['wall']:.3f} s ({r['wall'] / lat * 1e3:.1f} RTT) "
                      f"batch {r['batch']:.3f} s  cpu first {r['cpu_first']:.3f} s, 8 more "
                      f"{r['cpu_more']:.3f} s  requests {r['requests']} connections "
                      f"{r['connections']}", flush=True)
    print(f"median over {reps}, LAT={lat:g} ms: obstore / curl")
    for key in ("wall", "batch", "cpu_first", "cpu_more"):
        c = statistics.median(r[key] for r in got["curl"])
        o = statistics.median(r[key] for r in got["obstore"])
        ratios = [b[key] / a[key] for a, b in zip(got["curl"], got["obstore"])]
        print(f"  {key:10} curl {c:.3f}  obstore {o:.3f}  obstore/curl per repeat "
              f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    main()
