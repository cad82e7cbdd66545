"""Opening at scale (issue 15): open time and RSS growth, aioloader trees and Grain side by side.

    python benchmarks/bench_open.py --data-dir /tmp/bench_open \\
        --tree before=/work/wt-index-base --tree after=/work/wt-index --rounds 3

Datasets (written once with array_record's writer, group_size 1, 8-byte records):
`many` = 5M records in 100 files, `one` = 5M records in one file, `shards-N` = N files of
100 records (N in --shards). Each measurement is a fresh process (`--child`), so import and
allocator state are alike: it imports its library, then times opening the dataset, its
length and one record read (Grain's reader reads the footer lazily, so the read is part of
a fair open), and reports wall time, CPU time (user + system, all threads: the steadier
figure on a shared machine) and the growth of RSS (psutil) over the open.
aioloader runs without an index cache ("cold": footers parsed) and with a filled one
("cached"); gs:// runs against the local emulator (aioloader.testing.local_gcs). Rounds run
the contenders in turn (ABBA), on a warm page cache; the table gives median [min–max].
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORDS = 5_000_000
MANY_FILES = 100
SHARD_RECORDS = 100


# -- the child: one open in a fresh process -------------------------------------------------

def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _cpu() -> float:
    """User + system CPU seconds of this process so far, all threads (steadier than wall
    time on a shared machine)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(spec: dict) -> dict:
    paths = spec["paths"]
    if spec["lib"] == "grain":
        from grain.sources import ArrayRecordDataSource

        rss, cpu, t = _rss(), _cpu(), time.perf_counter()
        ds = ArrayRecordDataSource(paths)
        n = len(ds)
        ds[n // 2]
    else:
        import aioloader as al

        if spec.get("storage_options"):
            import gcsfs  # noqa: F401  (imported before timing: its import is another item)
        kw = {"index_cache_dir": spec["cache"]} if spec.get("cache") else {}
        if spec.get("storage_options"):
            kw["storage_options"] = spec["storage_options"]
        rss, cpu, t = _rss(), _cpu(), time.perf_counter()
        src = al.ArrayRecordSource(paths, **kw)
        n = len(src)
        src[n // 2]
    wall = time.perf_counter() - t
    cpu = _cpu() - cpu
    grew = _rss() - rss
    return {"wall": wall, "cpu": cpu, "rss": grew, "n": n}


# -- the datasets ----------------------------------------------------------------------------

def _write(path: Path, n: int) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    tmp = path.with_suffix(".tmp")
    w = ArrayRecordWriter(str(tmp), "group_size:1,uncompressed")
    for i in range(n):
        w.write(i.to_bytes(8, "little"))
    w.close()
    os.replace(tmp, path)


def datasets(root: Path, shards: list[int]) -> dict[str, str]:
    """name -> glob; written once."""
    out = {}
    for name, files, per in [("many", MANY_FILES, RECORDS // MANY_FILES), ("one", 1, RECORDS),
                             *[(f"shards-{s}", s, SHARD_RECORDS) for s in shards]]:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for k in range(files):
            p = d / f"part-{k:05d}.array_record"
            if not p.exists():
                _write(p, per)
        out[name] = str(d / "part-*.array_record")
    return out


def _expand(glob: str) -> list[str]:
    import glob as g

    return sorted(g.glob(glob))


# -- the driver ------------------------------------------------------------------------------

def run_child(python: str, tree: str | None, spec: dict) -> dict:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    out = subprocess.run([python, __file__, "--child", json.dumps(spec)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:  # e.g. the before tree refusing a 5M-chunk footer: a row saying so
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:160]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/bench_open")
    ap.add_argument("--tree", action="append", default=[],
                    help="NAME=PATH of an aioloader tree (default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shards", default="100,500,2000")
    ap.add_argument("--only", action="append", default=[], help="dataset names to run")
    ap.add_argument("--no-gcs", action="store_true")
    ap.add_argument("--no-grain", action="store_true")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    python = sys.executable
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(Path(__file__).parents[1])]]
    shards = [int(s) for s in args.shards.split(",") if s]
    data = datasets(Path(args.data_dir), shards)
    names = [n for n in data if not args.only or n in args.only]
    gcs_ctx = None
    gs_urls: dict[str, str] = {}
    storage_options: dict = {}
    if not args.no_gcs:
        from aioloader.testing import local_gcs

        gcs_ctx = local_gcs()
        gcs = gcs_ctx.__enter__()
        storage_options = gcs.storage_options
        for name in names:
            if name.startswith("shards-"):
                for p in _expand(data[name]):
                    gcs.upload(p, f"{name}/{Path(p).name}")
                gs_urls[name] = gcs.url(f"{name}/part-*.array_record")
    caches = {t: tempfile.mkdtemp(prefix=f"idx-{t}-") for t, _ in trees}
    results: dict[tuple, list[dict]] = {}
    try:
        for name in names:
            contenders = []
            for tname, tree in trees:
                contenders.append(((name, "local", tname, "cold"), tree,
                                   {"lib": "aio", "paths": data[name]}))
                cache = os.path.join(caches[tname], name)
                os.makedirs(cache, mode=0o700, exist_ok=True)
                contenders.append(((name, "local", tname, "cached"), tree,
                                   {"lib": "aio", "paths": data[name], "cache": cache}))
                if name in gs_urls:
                    contenders.append(((name, "gs", tname, "cold"), tree,
                                       {"lib": "aio", "paths": gs_urls[name],
                                        "storage_options": storage_options}))
                    gcache = cache + "-gs"
                    os.makedirs(gcache, mode=0o700, exist_ok=True)
                    contenders.append(((name, "gs", tname, "cached"), tree,
                                       {"lib": "aio", "paths": gs_urls[name], "cache": gcache,
                                        "storage_options": storage_options}))
            if not args.no_grain:
                contenders.append(((name, "local", "grain", "-"), None,
                                   {"lib": "grain", "paths": _expand(data[name])}))
            for _, tree, spec in contenders:  # warm the page cache and fill index caches
                run_child(python, tree, spec)
            for r in range(args.rounds):
                order = contenders if r % 2 == 0 else contenders[::-1]
                for key, tree, spec in order:
                    results.setdefault(key, []).append(run_child(python, tree, spec))
                    print(f"  {key}: {results[key][-1]}", file=sys.stderr)
    finally:
        if gcs_ctx is not None:
            gcs_ctx.__exit__(None, None, None)
    print("| dataset | where | contender | index | open s | CPU s | RSS growth MB | B/record |")
    print("|---|---|---|---|---|---|---|---|")
    for key, runs in results.items():
        if any("error" in x for x in runs):
            err = next(x["error"] for x in runs if "error" in x)
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | fails: {err} | | | |")
            continue
        n = runs[0]["n"]
        print(f"| {key[0]} ({n:,} rec) | {key[1]} | {key[2]} | {key[3]} | "
              f"{_cell([x['wall'] for x in runs], '.3f')} | "
              f"{_cell([x.get('cpu', float('nan')) for x in runs], '.2f')} | "
              f"{_cell([x['rss'] / 1e6 for x in runs], '.0f')} | "
              f"{statistics.median(x['rss'] for x in runs) / n:.1f} |")


def _cell(xs: list[float], f: str) -> str:
    return f"{statistics.median(xs):{f}} [{min(xs):{f}}–{max(xs):{f}}]"


if __name__ == "__main__":
    main()
