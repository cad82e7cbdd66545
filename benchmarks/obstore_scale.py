"""bench_scale's bucket workloads, libcurl vs obstore under aioloader's `Storage`.

Usage: PYTHONPATH=. python -m benchmarks.obstore_scale [--quick] [--data-dir DIR] [--repeats N]

Record by record (exact shuffle, one range GET per record, capped), the block shuffle and
the disk tier (two epochs: epoch 1 fills the cache from the bucket) of `bench_scale` (same
dataset, emulator behind the delay line at 30 ms ± 10 ms, workers=2, global shuffle →
json.loads → batch 256), each run in a fresh process with the stock libcurl backend and
with `benchmarks.obstore_backend.install()` first, alternating ABBA. Reported: records/s
after the first batch (the whole run; disk: epoch 1 and 2 too) and CPU µs per record after
the first batch (the process and its workers), with obstore ÷ curl per repeat.
Needs pip install obstore.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .bench_scale import SHARDS, SIZES, _rate
from .common import sharded_dataset

CHILD = r'''
import json, sys
if sys.argv[2] == "obstore":
    from benchmarks.obstore_backend import install
    install()
from benchmarks.bench_scale import child
r = child(json.loads(sys.argv[1]))
import benchmarks.obstore_backend as ob  # (which backend served the reads)
r["backends"] = [f"obstore x{ob.MADE}" if ob.MADE else
                 "curl" if "aioloader.io.gcs.backend" in sys.modules else "other"]
print("RESULT " + json.dumps(r), flush=True)
'''


def run(spec: dict[str, Any], client: str, host: str) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec), client],
                         capture_output=True, text=True, cwd=root, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(root), "OBSTORE_GCS_HOST": host})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"{client} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default="record,block,disk")
    args = p.parse_args()
    from aioloader.testing import local_gcs

    n, resident, cap_s, _ = SIZES["quick" if args.quick else "full"]
    paths = sharded_dataset(args, "text", n, SHARDS)
    file_bytes = sum(q.stat().st_size for q in paths)
    block_bytes, window_bytes = (1 << 20, 4 << 20) if args.quick else (4 << 20, 16 << 20)
    base = {"kind": "pipeline", "records_per_epoch": n, "resident_bytes": resident,
            "shuffle": "exact"}
    got: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with local_gcs(latency_ms=30, jitter_ms=10, proxy_process=True) as gcs:
        urls = [gcs.upload(q, f"scale/{q.name}") for q in paths]
        host = gcs.server_endpoint.split("//")[1]
        opts = gcs.storage_options
        specs = {
            "record": {**base, "paths": urls, "opts": opts, "max_seconds": cap_s},
            "block": {**base, "paths": urls, "opts": opts, "shuffle": "block",
                      "block_bytes": block_bytes, "window_bytes": window_bytes,
                      "max_seconds": 6 * cap_s,
                      **({"memory_budget": resident} if args.quick else {})},
            "disk": {**base, "paths": urls, "opts": opts, "epochs": 2,
                     "cache_bytes": 2 * file_bytes},
        }
        for rep in range(args.repeats):
            for name in args.only.split(","):
                spec = specs[name]
                if name == "disk":
                    import tempfile
                    spec = {**spec, "cache_dir": tempfile.mkdtemp(prefix="obstore-scale-")}
                for client in (("curl", "obstore") if rep % 2 == 0 else ("obstore", "curl")):
                    r = run(spec, client, host)
                    done = r["records"] - r["first_records"]
                    row = {"rate": _rate(r, n), "epoch1": _rate(r, n, 1),
                           "epoch2": _rate(r, n, 2),
                           "cpu_us_per_rec": r["steady_cpu"] / done * 1e6 if done else None}
                    got.setdefault((name, client), []).append(row)
                    print(f"{name:6} {client:8} {','.join(r['backends'])} " + "  ".join(
                        f"{k} {v:,.1f}" for k, v in row.items() if v is not None), flush=True)
    print(f"median over {args.repeats} (n={n:,}):")
    for name in args.only.split(","):
        for key in ("rate", "epoch1", "epoch2", "cpu_us_per_rec"):
            pairs = [(c[key], o[key]) for c, o in zip(got[(name, "curl")],
                                                      got[(name, "obstore")])
                     if c[key] and o[key]]  # (the same repeat)
            if pairs:
                mc = statistics.median(c for c, _ in pairs)
                mo = statistics.median(o for _, o in pairs)
                ratios = [o / c for c, o in pairs]
                print(f"  {name:6} {key:14} curl {mc:,.2f}  obstore {mo:,.2f}  obstore/curl "
                      f"per repeat {statistics.median(ratios):.2f} "
                      f"[{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    main()
