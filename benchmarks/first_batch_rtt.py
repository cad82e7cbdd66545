"""Time to first batch from a bucket in a fresh process, in round trips (issue 15).

Usage: PYTHONPATH=. [AIOLOADER_GCS_CLIENT=curl|fsspec] [LAT=30] [REPS=3] [PREIMPORT=1] \
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

`floor` rows (20 files, where the loader reads each record alone): what the same requests
cost a bare client on this emulator and delay line: a fresh process, one libcurl multi
handle, no loader — the files' suffix GETs (192 KiB each, as the open asks) all at once,
then 256 one-KiB range GETs pinned to the generations those returned (as the loader's
reads are: the emulator spends more CPU on those), 256 in flight, connections opened as
needed. `over floor` is the loader's first batch less the floor's median, in round trips:
the loader's own cost. The emulator answers a few thousand requests a second on this
machine and serves a cold batch of 256 more slowly than a warm one (each new connection
costs the delay line and the emulator CPU), so for 20 files the floor itself lies beyond
"4 RTT + one batch".
"""
from __future__ import annotations

import json
import os
import statistics
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


FLOOR = r'''
import json, random, sys, time
from urllib.parse import quote
import pycurl
spec = json.loads(sys.argv[1])
base = spec["opts"]["endpoint_url"]
paths = spec["paths"] if isinstance(spec["paths"], list) else [spec["paths"]]
t0 = time.perf_counter()

def url(u, generation=None):
    bucket, _, name = u[5:].partition("/")
    out = f"{base}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media"
    return out + (f"&generation={generation}" if generation else "")

multi = pycurl.CurlMulti()

def run(requests):
    """GET (url, range) all at once; each answer's x-goog-generation header."""
    heads = []
    for u, r in requests:
        c, h = pycurl.Curl(), []
        c.setopt(pycurl.URL, u)
        c.setopt(pycurl.RANGE, r)
        c.setopt(pycurl.WRITEFUNCTION, lambda b: None)
        c.setopt(pycurl.HEADERFUNCTION, h.append)
        multi.add_handle(c)
        heads.append(h)
    left = len(requests)
    while left:
        multi.select(0.005)
        while True:
            ret, left = multi.perform()
            if ret != pycurl.E_CALL_MULTI_PERFORM:
                break
    return [next((line.split(b":", 1)[1].strip().decode() for line in h
                  if line.lower().startswith(b"x-goog-generation:")), None) for h in heads]

gens = run([(url(u), "-196608") for u in paths])
rng = random.Random(0)
picks = [rng.randrange(len(paths)) for _ in range(256)]
run([(url(paths[k], gens[k]), f"{o}-{o + 1023}")
     for k, o in ((k, rng.randrange(900_000)) for k in picks)])
print(json.dumps({"wall": time.perf_counter() - t0}))
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
            floors: list[float] = []
            for _ in range(int(os.environ.get("REPS", "3"))):
                if what == "20 urls":  # (one file: the loader coalesces its reads)
                    out = subprocess.run(
                        [sys.executable, "-c", FLOOR,
                         json.dumps({"paths": spec, "opts": gcs.storage_options})],
                        capture_output=True, text=True, check=True,
                        preexec_fn=lambda: os.sched_setaffinity(0, client_cores))
                    floors.append(json.loads(out.stdout.strip().splitlines()[-1])["wall"])
                    s = lat / 1e3 if lat else float("nan")
                    print(f"{'floor':7} {'curl':5} {what:9} first {floors[-1]:.3f} s = "
                          f"{floors[-1] / s:.1f} RTT", flush=True)
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
                    over = (f"over floor {(r['wall'] - statistics.median(floors)) / s:.1f} RTT  "
                            if floors else "")
                    print(f"{name:7} {client:5} {what:9} first {r['wall']:.3f} s = "
                          f"{r['wall'] / s:.1f} RTT  batch {r['batch']:.3f} s  beyond "
                          f"{(r['wall'] - r['batch']) / s:.1f} RTT  {over}requests "
                          f"{after.requests - before.requests} connections "
                          f"{after.connections - before.connections}  gcsfs={r['gcsfs']} "
                          f"aiohttp={r['aiohttp']}", flush=True)


if __name__ == "__main__":
    main()
