"""The disk tier's second epoch against local disk, before/after trees side by side (ABBA).

    python benchmarks/disk_epoch2.py --trees /work/wt-base /work/main [--rounds 4] [--full]

Each run is one fresh process with `PYTHONPATH=<tree>` and its own emulator behind the
30 ms ± 10 ms delay line. In it, an exact shuffle → json.loads → batch 256, workers=2, over
1 KiB JSON records (bench_scale's dataset: --quick's 60k / 8 MiB resident_bytes by default,
220k / 32 MiB with --full): local disk; gs:// with a fresh `cache_dir`, two epochs in one
loader (epoch 1 fills the cache, epoch 2 reads it: "same loader"); a new loader over the
filled cache ("restarted"); local disk again. Each gs:// rate is divided by the mean of the
two local rates of the same run; CPU per record is the parent's and the workers' (all
descendant processes, the emulator's included: it serves nothing in epoch 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r'''
import asyncio, glob, json, os, resource, sys, tempfile, time
import aioloader as al
from aioloader.testing import local_gcs

DATA, RESIDENT = sys.argv[1], int(sys.argv[2])


def _descendants_cpu():
    me, tick, par = os.getpid(), os.sysconf("SC_CLK_TCK"), {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        par[int(p)] = (int(f[1]), sum(map(int, f[11:15])) / tick)  # reaped children too
    def mine(p):
        q = par.get(p)
        while q:
            if q[0] == me:
                return True
            q = par.get(q[0])
        return False
    return sum(v[1] for p, v in par.items() if mine(p))


def cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime, _descendants_cpu()


async def run(ds, n_epoch, **kw):
    """Rates (after the first batch) of each epoch, and CPU µs per record (parent, workers)."""
    pts, n, mark = [], 0, n_epoch
    p0, w0 = cpu()
    async with ds.loader(workers=2, resident_bytes=RESIDENT, **kw) as it:
        async for b in it:
            n += len(next(iter(b.values())))
            if not pts or n >= mark:  # the first batch (start-up left out); epoch ends
                pts.append((n, time.perf_counter()))
                mark += n_epoch if len(pts) > 1 else 0
        cache = it.stats().as_dict()["cache"]
    p1, w1 = cpu()
    rates = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(pts, pts[1:])]
    return rates, 1e6 * (p1 - p0) / n, 1e6 * (w1 - w0) / n, cache


async def main(paths, urls, opts):
    local = al.Dataset.from_arrayrecord(paths).shuffle(0).map(json.loads).batch(256)
    with al.ArrayRecordSource(paths) as src:
        n = len(src)
    def remote(epochs=1):
        ds = al.Dataset.from_arrayrecord(urls, storage_options=opts).shuffle(0)
        return (ds.repeat(epochs) if epochs > 1 else ds).map(json.loads).batch(256)
    out = {}
    r, p, w, _ = await run(local, n)
    out["local_a"] = dict(rate=r[0], parent=p, workers=w)
    with tempfile.TemporaryDirectory() as cache:
        r, p, w, c = await run(remote(2), n, cache_dir=cache, cache_bytes=1 << 34)
        out["same_loader"] = dict(rate1=r[0], rate2=r[1], parent=p, workers=w,
                                  remote=c.get("disk_records_remote"))
        await asyncio.sleep(3)  # the filler, if behind, finishes
        r, p, w, c = await run(remote(), n, cache_dir=cache, cache_bytes=1 << 34)
        out["restarted"] = dict(rate=r[0], parent=p, workers=w,
                                remote=c.get("disk_records_remote"))
    r, p, w, _ = await run(local, n)
    out["local_b"] = dict(rate=r[0], parent=p, workers=w)
    print(json.dumps(out))


if __name__ == "__main__":
    files = sorted(glob.glob(f"{DATA}/*"))
    with local_gcs(latency_ms=30, jitter_ms=10, proxy_process=True) as gcs:
        up = [gcs.upload(p, f"e2/{p.rsplit('/', 1)[1]}") for p in files]
        asyncio.run(main(files, up, gcs.storage_options))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", nargs=2, required=True, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--data-dir", default="/tmp/fleet-data")
    args = ap.parse_args()
    n, resident = (220_000, 32 << 20) if args.full else (60_000, 8 << 20)
    data = f"{args.data_dir}/text-n{n}-s20-g1-zstd3-v1"
    if not os.path.isdir(data):
        sys.exit(f"{data} missing: run `python -m benchmarks.bench_scale"
                 f"{'' if args.full else ' --quick'} --data-dir {args.data_dir}` once")
    work = Path(tempfile.mkdtemp(prefix="disk-epoch2-"))
    (work / "child.py").write_text(CHILD)
    res: dict[str, list[dict]] = {t: [] for t in args.trees}
    try:
        for k in range(args.rounds):
            order = list(args.trees) if k % 2 == 0 else list(reversed(args.trees))
            for tree in order:
                env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
                p = subprocess.run([sys.executable, str(work / "child.py"), data,
                                    str(resident)], cwd=work, env=env, capture_output=True,
                                   text=True, timeout=900)
                if p.returncode:
                    sys.exit(p.stderr[-3000:])
                out = json.loads(p.stdout.strip().splitlines()[-1])
                res[tree].append(out)
                loc = (out["local_a"]["rate"] + out["local_b"]["rate"]) / 2
                s, r = out["same_loader"], out["restarted"]
                print(f"round {k + 1} {tree}: local {loc:,.0f} rec/s; same loader epoch 2 "
                      f"{s['rate2'] / loc:.2f}x, restarted {r['rate'] / loc:.2f}x; "
                      f"CPU us/rec parent/workers: local {out['local_b']['parent']:.1f}/"
                      f"{out['local_b']['workers']:.1f}, same loader (2 epochs) "
                      f"{s['parent']:.1f}/{s['workers']:.1f}, restarted "
                      f"{r['parent']:.1f}/{r['workers']:.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def col(tree, f):
        xs = [f(o) for o in res[tree]]
        return f"{statistics.median(xs):.2f} [{min(xs):.2f}–{max(xs):.2f}]"

    def loc(o):
        return (o["local_a"]["rate"] + o["local_b"]["rate"]) / 2

    rows = [
        ("local rec/s", lambda o: loc(o) / 1000, "k"),
        ("same loader, epoch 2 ÷ local", lambda o: o["same_loader"]["rate2"] / loc(o), ""),
        ("restarted (new loader) ÷ local", lambda o: o["restarted"]["rate"] / loc(o), ""),
        ("epoch 1 ÷ local", lambda o: o["same_loader"]["rate1"] / loc(o), ""),
        ("parent CPU µs/rec, local (2nd run)", lambda o: o["local_b"]["parent"], ""),
        ("parent CPU µs/rec, restarted", lambda o: o["restarted"]["parent"], ""),
        ("workers CPU µs/rec, local (2nd run)", lambda o: o["local_b"]["workers"], ""),
        ("workers CPU µs/rec, restarted", lambda o: o["restarted"]["workers"], ""),
    ]
    print(f"\n| {n // 1000}k records, {args.rounds} rounds ABBA, median [range] | "
          + " | ".join(args.trees) + " |")
    print("|---|" + "---|" * len(args.trees))
    for name, f, unit in rows:
        print(f"| {name}{' (k)' if unit else ''} | " + " | ".join(col(t, f)
                                                                for t in args.trees) + " |")


if __name__ == "__main__":
    main()
