"""First batch against the number of files: the same 200k text records (1 KiB JSON, zstd,
group_size 1, written by array_record) cut into 10, 100, 500 and 2,000 files; aioloader trees
and Grain side by side, locally and from the emulated bucket.

    python benchmarks/bench_files.py --tree before=/path/a --tree after=/path/b \\
        [--files 10,100,500,2000] [--rounds 2] [--data-dir DIR] [--bucket] [--digests]

Every measurement runs in a fresh process (`benchmarks.contenders`, the library imported
before the clock), all contenders of all file counts in one list, in ABBA order over rounds,
after one untimed run each (page cache, bytecode). Each tree's bytecode is cached under a
temporary `PYTHONPYCACHEPREFIX`, as an installed package's is (the trees are not written to).

- `open`: `ArrayRecordSource(glob)`, `len`, one record (local files);
- `first`: global shuffle → json.loads → batch 256 with `loader(workers=2)`, from building the
  loader to the first batch in hand (the worker server's start, the listing, every footer,
  the plan, the first task), the server cold;
- `warm`: `first` after `aioloader.warm_up()` and a second's sleep (the server already up);
- `cached`: `first` with `index_cache_dir`, its entry written by the untimed run (`--cached`);
- Grain: the same pipeline, `ReadOptions(num_threads=N)`, the faster of N=1 and N=4 per round
  (local files only: Grain reads a bucket through a FUSE mount, which this machine lacks).

`--like` adds like-for-like rows, in a table of their own: aioloader `inline` (`workers=0`:
the pipeline on a thread of the process, as Grain's threads run it) against Grain's threads,
and aioloader `procs` (`--workers` processes, the server cold) against Grain with as many
worker processes (`mp_prefetch`). In these rows each library is wholly imported before the
clock: `import grain` loads all of Grain, while `import aioloader` defers its runtime (the
loader, scheduler, storage, asyncio: `aioloader.runtime.loader`) to the first loader, so
that import is done first, as `warm_up()` does, but without starting the worker server.

`--bucket` adds `first` and `warm` rows for the files in the emulated bucket behind a 30 ms
delay line (a process of its own), the same glob as a gs:// URL, and `bucket open` (`open`
from the bucket: wall, and the open's requests and bytes, listing excluded, in a table of
its own; with `--cached` also `bucket open cached`, its index cache entry written by the
untimed run, and `bucket-cached`: the first batch from the bucket with the default index
cache, `index_cache_dir="auto"`, in a directory of its own, its entry written by the untimed
run: a job restarted on the same files). Every other row runs with no default index cache
(`AIOLOADER_INDEX_CACHE=off`). `--digests` first checks that every tree gives the same
first three batches (workers 0 and 2, local files).

Reported: wall, median [min–max] over rounds; each row's first batch over its own first batch
at the fewest files (per round), and over Grain's local first batch (per round).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = 200_000
LATENCY_MS = 30


def _open_child(paths: str, storage_options: dict | None, index_cache_dir: str | None) -> dict:
    import time

    import aioloader as al
    from benchmarks.common import cpu_seconds

    cpu, t = cpu_seconds(), time.perf_counter()
    src = al.ArrayRecordSource(paths, storage_options=storage_options,
                               index_cache_dir=index_cache_dir)
    n = len(src)
    opened = src.storage.stats  # (the open's requests and bytes, before the record read)
    requests, got = opened.requests, opened.bytes
    src[n // 2]
    return {"wall": time.perf_counter() - t, "cpu": cpu_seconds() - cpu, "n": n,
            "requests": requests, "bytes": got}


def _digest_child(spec: dict) -> dict:
    import hashlib

    import aioloader as al
    from benchmarks import fns

    ds = al.Dataset.from_arrayrecord(spec["paths"]).shuffle(0).map(fns.decode_text).batch(256)
    h = hashlib.sha256()
    with ds.loader(workers=spec["workers"]) as it:
        for k, batch in enumerate(it):
            h.update(json.dumps(batch, sort_keys=True, default=repr).encode())
            if k == 2:
                break
    return {"digest": h.hexdigest()[:16]}


def _child(spec: dict) -> dict:
    """One measurement, in this fresh process: the library imported before timing."""
    if spec["lib"] == "open":
        return _open_child(spec["paths"][0], spec.get("storage_options"),
                           spec.get("index_cache_dir"))
    if spec["lib"] == "digest":
        return _digest_child(spec)
    spec.pop("index_dir", None)  # (the environment's: `run_child`)
    if spec["lib"] == "grain":
        import grain  # noqa: F401
    else:
        import aioloader

        if spec.pop("eager", False):  # its runtime too, as `import grain` loads all of Grain
            import importlib

            importlib.import_module("aioloader.runtime.loader")  # (what warm_up() imports)
        if spec.pop("warm", False):
            import time

            aioloader.warm_up()
            time.sleep(1.0)
    from benchmarks.contenders import run

    out = run(spec)
    return {"wall": out["ttfb"], "cpu": out["cpu"]}


def run_child(tree: str | None, spec: dict, pycache: str) -> dict:
    # no default index cache in the user's cache directory, unless the row is about it
    env = dict(os.environ, GRAIN_LOG_LEVEL="error", PYTHONPYCACHEPREFIX=pycache,
               AIOLOADER_INDEX_CACHE=spec.get("index_dir", "off"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # (an installed package has its bytecode)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, str(ROOT)) if p)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:  # (2,000 paths: not argv)
        json.dump(spec, f)
        f.flush()
        out = subprocess.run([sys.executable, __file__, "--child", f.name], env=env,
                             capture_output=True, text=True, check=False, cwd=ROOT,
                             timeout=600)
    for line in out.stdout.splitlines()[::-1]:
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"child failed: {out.stderr.strip()[-600:]}")


def _measured(key: tuple, tree: str | None, spec: dict, pycache: str) -> dict:
    """`run_child`, a failure kept as an infinite wall (shown as `inf` in its row) so that
    one starved run (a read timed out on a loaded machine) does not lose the others."""
    try:
        return run_child(tree, spec, pycache)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"  {key}: FAILED {err}", file=sys.stderr)
        return {"wall": float("inf"), "cpu": float("inf"), "error": str(err)[-300:]}


def _bucket(folders: dict[int, Path]):
    """The emulated bucket behind the delay line, holding every file count's files."""
    from aioloader.testing import local_gcs

    cm = local_gcs(latency_ms=LATENCY_MS, proxy_process=True)
    gcs = cm.__enter__()
    globs = {}
    for files, folder in folders.items():
        for path in sorted(folder.glob("*.array_record")):
            gcs.upload(path, f"{folder.name}/{path.name}")
        globs[files] = gcs.url(f"{folder.name}/*.array_record")
    return cm, gcs, globs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of a tree")
    ap.add_argument("--files", default="10,100,500,2000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data-dir", default=str(ROOT / "benchmarks" / "data"))
    ap.add_argument("--no-grain", action="store_true")
    ap.add_argument("--no-warm", action="store_true", help="no rows with the server warm")
    ap.add_argument("--cached", action="store_true", help="rows with an index cache")
    ap.add_argument("--bucket", action="store_true", help="rows from the emulated bucket")
    ap.add_argument("--digests", action="store_true", help="check the trees' batches agree")
    ap.add_argument("--like", action="store_true",
                    help="like-for-like rows: workers=0 against Grain's threads, workers=N "
                         "against Grain's N worker processes")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--from-json", help="report (and plot) the results of an earlier run")
    ap.add_argument("--plot", help="draw the first batch against the files into this PNG")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        with open(args.child) as f:
            print("RESULT " + json.dumps(_child(json.load(f))), flush=True)
        os._exit(0)  # Grain's prefetch threads may still be busy: don't wait for them
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import sharded_dataset

    trees = [t.split("=", 1) for t in args.tree] or [["this", str(ROOT)]]
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        res = {(int(k.split("|")[0]), *k.split("|")[1:]): v for k, v in saved.items()}
        counts = sorted({k[0] for k in res})
        _report(res, counts, [n for n, _ in trees], args)
        if args.plot:
            save_plot(res, counts, [n for n, _ in trees], Path(args.plot))
        return
    caches = {name: tempfile.mkdtemp(prefix=f"pyc-{name}-") for name, _ in trees}
    caches["grain"] = tempfile.mkdtemp(prefix="pyc-grain-")
    counts = [int(s) for s in args.files.split(",")]
    gen = types.SimpleNamespace(data_dir=args.data_dir)
    folders = {n: sharded_dataset(gen, "text", RECORDS, n)[0].parent for n in counts}
    globs = {n: str(folders[n] / "*.array_record") for n in counts}
    if args.digests:
        for files in counts:
            for workers in (0, args.workers):
                got = {name: run_child(tree, {"lib": "digest", "paths": [globs[files]],
                                              "workers": workers}, caches[name])["digest"]
                       for name, tree in trees}
                print(f"digests, {files} files, workers={workers}: {got}", file=sys.stderr)
                if len(set(got.values())) != 1:
                    raise SystemExit(f"the trees' batches differ: {got}")
    bucket = _bucket(folders) if args.bucket else None
    res: dict[tuple, list[dict]] = {}
    try:
        todo = []  # every file count's contenders in one list: load drift hits them alike
        for files in counts:
            base = {"decode": "decode_text", "batch": 256, "max_batches": 1}
            for name, tree in trees:
                first = {**base, "lib": "aioloader", "paths": [globs[files]],
                         "workers": args.workers}
                todo.append(((files, name, "open"), tree, {"lib": "open",
                                                            "paths": [globs[files]]}))
                todo.append(((files, name, "first"), tree, first))
                if args.like:
                    eager = {**first, "eager": True}
                    todo.append(((files, name, "inline"), tree, {**eager, "workers": 0}))
                    todo.append(((files, name, "procs"), tree, eager))
                if not args.no_warm:
                    todo.append(((files, name, "warm"), tree, {**first, "warm": True}))
                if args.cached:
                    cache = tempfile.mkdtemp(prefix=f"idx-{name}-{files}-")
                    todo.append(((files, name, "cached"), tree,
                                 {**first, "index_cache_dir": cache}))
                if bucket is not None:
                    remote = {**first, "paths": [bucket[2][files]],
                              "storage_options": bucket[1].storage_options}
                    todo.append(((files, name, "bucket"), tree, remote))
                    opens = {"lib": "open", "paths": [bucket[2][files]],
                             "storage_options": bucket[1].storage_options}
                    todo.append(((files, name, "bucket-open"), tree, opens))
                    if args.cached:
                        cache = tempfile.mkdtemp(prefix=f"idx-{name}-{files}-gs-")
                        todo.append(((files, name, "bucket-open-cached"), tree,
                                     {**opens, "index_cache_dir": cache}))
                        # the default index cache (`index_cache_dir="auto"`), in a
                        # directory of its own, its entry written by the untimed run
                        todo.append(((files, name, "bucket-cached"), tree,
                                     {**remote, "index_dir": tempfile.mkdtemp(
                                         prefix=f"idx-{name}-{files}-auto-")}))
                    if not args.no_warm:
                        todo.append(((files, name, "bucket-warm"), tree,
                                     {**remote, "warm": True}))
            if not args.no_grain:
                paths = [str(p) for p in sorted(folders[files].glob("*.array_record"))]
                for n in (1, 4):
                    todo.append(((files, "grain", f"N{n}"), None,
                                 {**base, "lib": "grain", "threads": n, "paths": paths}))
                if args.like:
                    todo.append(((files, "grain", f"P{args.workers}"), None,
                                 {**base, "lib": "grain", "procs": args.workers,
                                  "paths": paths}))
        for key, tree, spec in todo:
            _measured(key, tree, spec, caches[key[1]])
        for r in range(args.rounds):
            for key, tree, spec in (todo if r % 2 == 0 else todo[::-1]):
                out = _measured(key, tree, spec, caches[key[1]])
                res.setdefault(key, []).append(out)
                print(f"  {key}: {out}", file=sys.stderr)
    finally:
        if bucket is not None:
            bucket[0].__exit__(None, None, None)
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(map(str, k)): v
                                               for k, v in res.items()}))
    _report(res, counts, [n for n, _ in trees], args)
    if args.plot:
        save_plot(res, counts, [n for n, _ in trees], Path(args.plot))


def save_plot(res: dict, counts: list[int], names: list[str], path: Path) -> None:
    """The first batch (median) against the number of files: each tree with the worker
    server cold and warm, and Grain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def median(key: tuple) -> float:
        return statistics.median(x["wall"] for x in res[key])

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=90)
    for k, name in enumerate(names):
        for kind, style in (("first", "o-"), ("warm", "o--"), ("bucket", "s:"),
                            ("bucket-cached", "s-.")):
            if (counts[0], name, kind) in res:
                label = {"first": "server cold", "warm": "server warm",
                         "bucket": "bucket, 30 ms",
                         "bucket-cached": "bucket, 30 ms, index cached"}[kind]
                ax.plot(counts, [median((n, name, kind)) for n in counts], style,
                        color=f"C{k}", label=f"aioloader {name}, {label}")
    if (counts[0], "grain", "N1") in res:
        grain = [statistics.median(min(a["wall"], b["wall"]) for a, b in
                                   zip(res[(n, "grain", "N1")], res[(n, "grain", "N4")]))
                 for n in counts]
        ax.plot(counts, grain, "^-", color="C3", label="Grain (faster of 1, 4 threads)")
    ax.set_xscale("log")
    ax.set_xticks(counts, [f"{n:,}" for n in counts])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("files (the same 200k records of 1 KiB JSON)")
    ax.set_ylabel("first batch, s (median)")
    ax.set_title("First batch of 256 (global shuffle, workers=2), 2 cores "
                 "(the machine's load: RESULTS.md)")
    ax.title.set_fontsize(9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _cell(xs: list[float], f: str = ".3f") -> str:
    return f"{statistics.median(xs):{f}} [{min(xs):{f}}–{max(xs):{f}}]"


def _report(res: dict, counts: list[int], names: list[str], args) -> None:
    kinds = ["first"] + ([] if args.no_warm else ["warm"]) + (["cached"] if args.cached else [])
    if args.bucket:
        kinds += ["bucket"] + ([] if args.no_warm else ["bucket-warm"]) + \
            (["bucket-cached"] if args.cached else [])
    print(f"| files | tree | open s | {' | '.join(k + ' s' for k in kinds)} | "
          f"first ÷ own at {counts[0]} | warm ÷ own at {counts[0]} | "
          + (f"bucket ÷ own at {counts[0]} | " if args.bucket else "")
          + (f"bucket-cached ÷ own at {counts[0]} | " if args.bucket and args.cached else "")
          + "first ÷ Grain |")
    extra = args.bucket + (args.bucket and args.cached)
    print("|---" * (6 + len(kinds) + extra) + "|")
    for files in counts:
        grain = None
        if not args.no_grain:
            grain = [min(a["wall"], b["wall"]) for a, b in
                     zip(res[(files, "grain", "N1")], res[(files, "grain", "N4")])]
        for name in names:
            cells = [_cell([x["wall"] for x in res[(files, name, k)]]) for k in kinds]
            ratios = []
            for k in ["first", "warm"] + (["bucket"] if args.bucket else []) + \
                    (["bucket-cached"] if args.bucket and args.cached else []):
                if (files, name, k) not in res:
                    ratios.append("-")
                    continue
                now = [x["wall"] for x in res[(files, name, k)]]
                at = [x["wall"] for x in res[(counts[0], name, k)]]
                ratios.append(_cell([a / b for a, b in zip(now, at)], ".2f"))
            first = [x["wall"] for x in res[(files, name, "first")]]
            vs = _cell([f / g for f, g in zip(first, grain)], ".2f") if grain else "-"
            opened = _cell([x["wall"] for x in res[(files, name, "open")]])
            print(f"| {files} | {name} | {opened} | {' | '.join(cells)} | "
                  f"{' | '.join(ratios)} | {vs} |")
        if grain:
            blank = ["-"] * (len(kinds) - 1 + 2 + extra)
            print(" | ".join([f"| {files}", "Grain (faster of N=1, 4)", "-", _cell(grain),
                              *blank, "1 |"]))
    if args.bucket:
        _report_bucket_open(res, counts, names)
    if args.like and not args.no_grain:
        _report_like(res, counts, names, args.workers)


def _report_like(res: dict, counts: list[int], names: list[str], workers: int) -> None:
    """Like for like, each library wholly imported before the clock: in-process (aioloader
    workers=0, Grain's threads) and with worker processes (aioloader's, the server cold;
    Grain's `mp_prefetch`), first batch and ratio, per round; last, aioloader's own
    2,000-file ÷ 10-file figure of each."""
    print(f"\n| files | tree | workers=0 s | Grain threads s | ÷ Grain | ÷ own at {counts[0]} | "
          f"workers={workers} s (server cold) | Grain {workers} processes s | ÷ Grain | "
          f"÷ own at {counts[0]} |")
    print("|---" * 10 + "|")

    def walls(files: int, name: str, kind: str) -> list[float]:
        return [x["wall"] for x in res[(files, name, kind)]]

    for files in counts:
        threads = [min(a, b) for a, b in zip(walls(files, "grain", "N1"),
                                             walls(files, "grain", "N4"))]
        procs = walls(files, "grain", f"P{workers}")
        for name in names:
            cells = []
            for kind, peer in (("inline", threads), ("procs", procs)):
                own = walls(files, name, kind)
                at = walls(counts[0], name, kind)
                cells += [_cell(own), _cell(peer), _cell([a / b for a, b in zip(own, peer)],
                                                         ".2f"),
                          _cell([a / b for a, b in zip(own, at)], ".2f")]
            print(f"| {files} | {name} | {' | '.join(cells)} |")


def _report_bucket_open(res: dict, counts: list[int], names: list[str]) -> None:
    """The open from the bucket (and with an index cache): wall, and its requests and bytes
    per file (listing aside)."""
    print(f"\n| files | tree | open | s | ÷ own at {counts[0]} | requests a file | "
          "KiB a file |")
    print("|---" * 7 + "|")
    for files, name, kind in ((f, n, k) for f in counts for n in names
                              for k in ("bucket-open", "bucket-open-cached")):
        got = res.get((files, name, kind))
        if not got:
            continue
        at = [x["wall"] for x in res[(counts[0], name, kind)]]
        ratio = _cell([x["wall"] / b for x, b in zip(got, at)], ".2f")
        reqs = statistics.median(x.get("requests", 0) for x in got) / files
        kib = statistics.median(x.get("bytes", 0) for x in got) / files / 1024
        how = "cached" if kind.endswith("cached") else "cold"
        print(f"| {files} | {name} | {how} | {_cell([x['wall'] for x in got])} | "
              f"{ratio} | {reqs:.2f} | {kib:.1f} |")


if __name__ == "__main__":
    main()
