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
WIDE_RECORDS = 2_000


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


async def _floor(pattern: str, options: dict, reads: str, concurrency: int) -> int:
    """The bare client's open: one listing, then one read per file, `concurrency` in flight
    (as `opening._Opener` reads them), then one small read (the record read). No parse, no
    retries' bookkeeping, no loader: the floor an open of these files can reach. Each read is
    pinned to the generation listed, as the open pins them (the same requests: the emulator
    spends twice the CPU on a read that names a generation, RESULTS.md). `reads`:
    "tail:N" (the last N bytes, the open before stop 26) or "span:N" (N bytes before the
    postscript and its first 512: `open_index(span=N)`)."""
    import asyncio

    from aioloader.io.gcs.backend import CurlGCSBackend

    pins: dict[str, str] = {}  # filled from the listing: each read names its generation,
    backend = CurlGCSBackend(options, concurrency, pins)  # as the open's reads must
    try:
        files = await backend.glob(pattern)
        pins.update((f.url, f.version) for f in files if f.version)
        todo = iter(files)

        how, _, n = reads.partition(":")

        async def reader() -> None:
            for f in todo:
                if how == "tail":
                    await backend.read(f.url, max(0, f.size - int(n)), f.size)
                else:
                    post_at = f.size - (1 << 16)
                    await backend.read(f.url, max(0, post_at - int(n)), post_at + 512)

        await asyncio.gather(*(reader() for _ in range(min(concurrency, len(files)))))
        await backend.read(files[len(files) // 2].url, 0, 16)
        return len(files)
    finally:
        await backend.aclose()


def child(spec: dict) -> dict:
    paths = spec["paths"]
    if spec["lib"] == "floor":
        import asyncio

        import gcsfs  # imported before timing, as for aio below

        import aioloader.io.gcs.backend

        rss, cpu, t = _rss(), _cpu(), time.perf_counter()
        n = asyncio.run(_floor(paths, spec["storage_options"], spec["reads"], spec["concurrency"]))
    elif spec["lib"] == "grain":
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
        # `import aioloader` is lazy: naming the class imports its modules. Imported before
        # timing, as Grain's class is above: the open is timed, not the import.
        source = al.ArrayRecordSource
        rss, cpu, t = _rss(), _cpu(), time.perf_counter()
        src = source(paths, **kw)
        n = len(src)
        src[n // 2]
    wall = time.perf_counter() - t
    cpu = _cpu() - cpu
    grew = _rss() - rss
    return {"wall": wall, "cpu": cpu, "rss": grew, "n": n}


# -- the datasets ----------------------------------------------------------------------------

def _write(path: Path, n: int, size: int = 8) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    tmp = path.with_suffix(".tmp")
    w = ArrayRecordWriter(str(tmp), "group_size:1,uncompressed")
    for i in range(n):
        w.write(i.to_bytes(8, "little") * (size // 8))
    w.close()
    os.replace(tmp, path)


def datasets(root: Path, shards: list[int], wide: list[int] | None = None) -> dict[str, str]:
    """name -> glob; written once. `wide-N`: N files of ~1.3 MB (2,000 records of 600 bytes),
    larger than the 1 MiB that opening read of each remote file before stop 26."""
    out = {}
    for name, files, per, size in [
            ("many", MANY_FILES, RECORDS // MANY_FILES, 8), ("one", 1, RECORDS, 8),
            *[(f"shards-{s}", s, SHARD_RECORDS, 8) for s in shards],
            *[(f"wide-{s}", s, WIDE_RECORDS, 600) for s in wide or []]]:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for k in range(files):
            p = d / f"part-{k:05d}.array_record"
            if not p.exists():
                _write(p, per, size)
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
    ap.add_argument("--wide", default="", help="file counts of wide-N datasets (e.g. 300)")
    ap.add_argument("--only", action="append", default=[], help="dataset names to run")
    ap.add_argument("--no-gcs", action="store_true")
    ap.add_argument("--no-local", action="store_true", help="gs:// rows only")
    ap.add_argument("--no-cached", action="store_true", help="cold opens only")
    ap.add_argument("--no-grain", action="store_true")
    ap.add_argument("--latency", default="0",
                    help="gs:// delay-line latencies in ms, comma-separated (one emulator each)")
    ap.add_argument("--floor", action="append", default=[],
                    help="NAME=READS: a bare-client floor row (listing + one read per file, "
                         "64 in flight; READS is tail:N or span:N, see _floor), e.g. "
                         "floor=tail:1048576")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    python = sys.executable
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(Path(__file__).parents[1])]]
    floors = [tuple(f.split("=", 1)) for f in args.floor]
    shards = [int(s) for s in args.shards.split(",") if s]
    data = datasets(Path(args.data_dir), shards, [int(s) for s in args.wide.split(",") if s])
    names = [n for n in data if not args.only or n in args.only]
    caches = {t: tempfile.mkdtemp(prefix=f"idx-{t}-") for t, _ in trees}
    results: dict[tuple, list[dict]] = {}
    sites = ([] if args.no_local else [None]) + (
        [] if args.no_gcs else [float(x) for x in args.latency.split(",") if x])
    for site in sites:
        _run_site(site, names, data, trees, floors, caches, args, python, results)
    print("| dataset | where | contender | index | open s | CPU s | RSS growth MB | requests "
          "| MB read |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, runs in results.items():
        if any("error" in x for x in runs):
            err = next(x["error"] for x in runs if "error" in x)
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | fails: {err} | | | | |")
            continue
        reqs = f"{statistics.median(x['requests'] for x in runs):.0f}" if "requests" in runs[0] \
            else "-"
        mb = f"{statistics.median(x['bytes'] for x in runs) / 1e6:.1f}" if "bytes" in runs[0] \
            else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | "
              f"{_cell([x['wall'] for x in runs], '.3f')} | "
              f"{_cell([x.get('cpu', float('nan')) for x in runs], '.2f')} | "
              f"{_cell([x['rss'] / 1e6 for x in runs], '.0f')} | {reqs} | {mb} |")


def _run_site(site: float | None, names: list[str], data: dict[str, str], trees: list,
              floors: list[tuple[str, ...]], caches: dict[str, str], args: argparse.Namespace,
              python: str, results: dict[tuple, list[dict]]) -> None:
    """Every contender on one site: local files (`site` None), or the emulator behind the
    delay line at `site` ms (its counters give each gs:// run's requests and bytes)."""
    gcs_ctx = gcs = None
    urls: dict[str, str] = {}
    if site is not None:
        from aioloader.testing import local_gcs

        gcs_ctx = local_gcs(latency_ms=site, proxy_process=True)
        gcs = gcs_ctx.__enter__()
        for name in names:
            if name.startswith(("shards-", "wide-")):
                for p in _expand(data[name]):
                    gcs.upload(p, f"{name}/{Path(p).name}")
                urls[name] = gcs.url(f"{name}/part-*.array_record")
    where = "local" if site is None else f"gs {site:g} ms"
    try:
        for name in names:
            if site is not None and name not in urls:
                continue
            paths = data[name] if site is None else urls[name]
            opts = {} if gcs is None else {"storage_options": gcs.storage_options}
            contenders = []
            for tname, tree in trees:
                contenders.append(((name, where, tname, "cold"), tree,
                                   {"lib": "aio", "paths": paths, **opts}))
                if not args.no_cached:
                    cache = os.path.join(caches[tname], f"{name}-{where.replace(' ', '')}")
                    os.makedirs(cache, mode=0o700, exist_ok=True)
                    contenders.append(((name, where, tname, "cached"), tree,
                                       {"lib": "aio", "paths": paths, "cache": cache, **opts}))
            if gcs is not None:
                for fname, reads in floors:
                    contenders.append(((name, where, fname, "-"), trees[0][1],
                                       {"lib": "floor", "paths": paths, "reads": reads,
                                        "concurrency": 64, **opts}))
            elif not args.no_grain:
                contenders.append(((name, where, "grain", "-"), None,
                                   {"lib": "grain", "paths": _expand(data[name])}))
            for _, tree, spec in contenders:  # warm the page cache and fill index caches
                run_child(python, tree, spec)
            for r in range(args.rounds):
                order = contenders if r % 2 == 0 else contenders[::-1]
                for key, tree, spec in order:
                    before = gcs.proxy_stats if gcs is not None else None
                    out = run_child(python, tree, spec)
                    if before is not None:
                        after = gcs.proxy_stats
                        out["requests"] = after.requests - before.requests
                        out["bytes"] = after.bytes_down - before.bytes_down
                    results.setdefault(key, []).append(out)
                    print(f"  {key}: {out}", file=sys.stderr)
    finally:
        if gcs_ctx is not None:
            gcs_ctx.__exit__(None, None, None)


def _cell(xs: list[float], f: str) -> str:
    return f"{statistics.median(xs):{f}} [{min(xs):{f}}–{max(xs):{f}}]"


if __name__ == "__main__":
    main()
