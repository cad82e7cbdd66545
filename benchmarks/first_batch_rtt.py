"""First batch from a bucket in a fresh process: wall, requests, RTTs (30 ms fixed)."""
import json, os, subprocess, sys, time
from pathlib import Path
from aioloader.testing import local_gcs

CHILD = r'''
import os, sys, time, json
t0 = time.perf_counter()
import aioloader
if os.environ.get("PREIMPORT"):
    import gcsfs, aiohttp
t_imp = time.perf_counter() - t0
t0 = time.perf_counter()
spec = json.loads(sys.argv[1])
ds = aioloader.Dataset.from_arrayrecord(spec["paths"], storage_options=spec["opts"]).shuffle(0).batch(256)
it = iter(ds.loader(workers=0, io_concurrency=256, resident_bytes=0))
b = next(it)
t = time.perf_counter() - t0
print(json.dumps({"wall": t, "import": t_imp, "gcsfs": "gcsfs" in sys.modules, "aiohttp": "aiohttp" in sys.modules}))
os._exit(0)
'''

def main():
    wt = sys.argv[1]
    data = Path("/tmp/req/data"); data.mkdir(exist_ok=True)
    from array_record.python.array_record_module import ArrayRecordWriter
    paths = []
    for k in range(20):
        p = data / f"t-{k:02d}.array_record"
        if not p.exists():
            w = ArrayRecordWriter(str(p), "group_size:1,zstd:3")
            for i in range(1000):
                w.write(json.dumps({"i": i, "t": "x" * 900}).encode())
            w.close()
        paths.append(p)
    lat = float(os.environ.get("LAT", "30"))
    with local_gcs(latency_ms=lat, proxy_process=True) as gcs:
        urls = [gcs.upload(p, f"text/{p.name}") for p in paths]
        env = {**os.environ, "PYTHONPATH": wt}
        for what, spec_paths in (("glob", gcs.url("text/*.array_record")), ("one file", urls[0]), ("20 urls", urls)):
            for rep in range(int(os.environ.get("REPS", "3"))):
                before = gcs.proxy_stats
                out = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"paths": spec_paths, "opts": gcs.storage_options})],
                                     env=env, capture_output=True, text=True, cwd=wt)
                if out.returncode:
                    print(out.stderr[-2000:]); return
                r = json.loads(out.stdout.strip().splitlines()[-1])
                after = gcs.proxy_stats
                print(f"{os.environ.get('AIOLOADER_GCS_CLIENT','auto'):8} {what:9} RTT {(r['wall'])/ (lat/1e3) if lat else 0:.1f} wall {r['wall']:.3f}s import {r['import']:.3f}s  requests {after.requests - before.requests} conns {after.connections - before.connections}  gcsfs={r['gcsfs']} aiohttp={r['aiohttp']}")

main()
