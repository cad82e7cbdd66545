"""The bounded memory tier's readahead, before/after in one sitting: block shuffle and
sequential reads from a bucket against the same pipelines on local disk (issue 15, stop 24).

    PYTHONPATH=$PWD python -m benchmarks.bench_readahead --data-dir /tmp/fleet-data \\
        [--before /work/wt-base] [--quick] [--repeats N] [--profile DIR]

The dataset, bucket and pipeline are `bench_scale`'s (1 KiB JSON records, 20 shards, at least
4× `resident_bytes`; emulator behind the delay line at 30 ms ± 10 ms; json.loads, batch 256,
workers=2; one fresh process per run, rates after the first batch). Rows: local disk with an
exact shuffle, a block shuffle (4 MiB blocks, 16 MiB window; --quick: 1 MiB, 4 MiB) and no
shuffle (`--cases default`: a block shuffle with every size left unset); then, for each tree
(`--before`, and this one), gs:// with the block shuffle and with no shuffle. Each repeat runs
every row once, the order reversed on odd repeats (ABBA); each bucket row's ratio is to the
local row of the same pipeline in the same repeat; the parent's own CPU (all its threads,
not the workers') is a column. `--profile DIR`: each row once more under py-spy, its
functions by samples (the parent only, the thread holding the GIL: Python's work, not
C code that lets the GIL go, nor threads that wait); `--repeats 0` profiles only. Every
child imports aioloader from its own tree (this script's copy of the benchmarks is run from
a neutral directory, so that `python -m` finds no aioloader in the current directory).
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
from typing import Any

from .bench_scale import SHARDS, SIZES, _rate
from .common import log, sharded_dataset

HERE = Path(__file__).resolve().parent


def _child(tree: Path, workdir: Path, spec: dict[str, Any],
           profile: Path | None = None) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "benchmarks.bench_scale", "--child", json.dumps(spec)]
    if profile is not None:  # the parent alone, sampled (its workers are not followed)
        spy = Path(sys.executable).with_name("py-spy")
        # (--gil: the thread holding the GIL, so that threads waiting are not counted)
        cmd = [str(spy), "record", "-r", "200", "--gil", "--format", "raw", "-o",
               str(profile), "--", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, env=env, cwd=workdir, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    lines = [ln for ln in proc.stdout.decode(errors="replace").splitlines()
             if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": proc.stderr.decode(errors="replace")[-400:]}
    return json.loads(lines[-1][len("RESULT "):])


def _fmt(xs: list[float], k: float = 1.0, digits: int = 2) -> str:
    if not xs:
        return "—"
    xs = [x / k for x in xs]
    return f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}–{max(xs):.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, default=None, help="the tree before the change")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--cases", default="block,none", help="bucket pipelines: block,default,none")
    p.add_argument("--profile", type=Path, default=None,
                   help="after the repeats, run each row once more under py-spy (the parent "
                        "process; not timed) and write its samples and a summary here")
    args = p.parse_args(argv)
    from aioloader.testing import local_gcs

    n, resident, _, _ = SIZES["quick" if args.quick else "full"]
    block_bytes, window_bytes = (1 << 20, 4 << 20) if args.quick else (4 << 20, 16 << 20)
    paths = sharded_dataset(args, "text", n, SHARDS)
    file_bytes = sum(q.stat().st_size for q in paths)
    trees = {"after": HERE.parent}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    workdir = Path(tempfile.mkdtemp(prefix="bench-readahead-"))
    shutil.copytree(HERE, workdir / "benchmarks",
                    ignore=shutil.ignore_patterns("data", "__pycache__", "*.png"))
    cases = args.cases.split(",")
    base = {"kind": "pipeline", "records_per_epoch": n, "resident_bytes": resident}
    pipes = {"exact": {"shuffle": "exact"},
             "block": {"shuffle": "block", "block_bytes": block_bytes,
                       "window_bytes": window_bytes,
                       **({"memory_budget": resident} if args.quick else {})},
             "default": {"shuffle": "block"},  # sizes and budgets left to the loader
             "none": {"shuffle": "none",  # --quick: 2 MiB segments, as for the block rows
                      **({"memory_budget": resident} if args.quick else {})}}
    res: dict[str, list[dict[str, Any]]] = {}
    try:
        with local_gcs(latency_ms=30, jitter_ms=10, proxy_process=True) as gcs:
            urls = [gcs.upload(q, f"scale/{q.name}") for q in paths]
            runs: list[tuple[str, Path, dict[str, Any]]] = []
            for pipe in ["exact", *cases]:
                runs.append((f"local {pipe}", HERE.parent,
                             {**base, **pipes[pipe], "paths": [str(q) for q in paths]}))
            for tree, root in trees.items():
                for pipe in cases:
                    runs.append((f"gs {pipe} {tree}", root,
                                 {**base, **pipes[pipe], "paths": urls,
                                  "opts": gcs.storage_options}))
            for k in range(args.repeats):
                for name, root, spec in (runs if k % 2 == 0 else runs[::-1]):
                    out = _child(root, workdir, spec)
                    if "error" in out:
                        log(f"{name}: {out['error']}")
                    res.setdefault(name, []).append(out)
                    r = _rate(out, n)
                    cpu = out.get("steady_cpu", 0) / max(1, out.get("records", 0)
                                                          - out.get("first_records", 0))
                    log(f"repeat {k + 1}: {name}: {r or 0:,.0f} rec/s, {cpu * 1e6:.0f} µs "
                        f"CPU/record, "
                        f"stages {out.get('stages')} cache {out.get('cache')}")
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                for name, root, spec in runs:
                    raw = args.profile / (name.replace(" ", "-") + ".txt")
                    out = _child(root, workdir, spec, profile=raw)
                    summary = profiled(raw, out)
                    if summary is None:
                        log(f"profile {name}: no samples ({out.get('error', 'none written')})")
                        continue
                    (args.profile / (name.replace(" ", "-") + ".summary.txt")).write_text(
                        summary)
                    log(f"profile {name}:\n{summary}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not res:  # --repeats 0: profiles only
        return 0
    print(f"\n{n:,} records, {file_bytes / 1e6:.0f} MB = {file_bytes / resident:.1f}× "
          f"resident_bytes {resident >> 20} MiB; block {block_bytes >> 20} MiB, window "
          f"{window_bytes >> 20} MiB; {args.repeats} repeats\n")
    print("| row | k rec/s | ÷ local, same pipeline | ÷ local exact | CPU µs/record | "
          "parent's CPU µs/record | requests | MB fetched into the tier | tasks that waited "
          "| first batch s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    exact = [_rate(o, n) for o in res["local exact"]]
    for name, outs in res.items():
        rates = [_rate(o, n) for o in outs]
        pipe = name.split()[1]
        local = [_rate(o, n) for o in res[f"local {pipe}"]]
        gs = name.startswith("gs")
        ratio = [a / b for a, b in zip(rates, local) if a and b] if gs else []
        vs_exact = [a / b for a, b in zip(rates, exact) if a and b] if gs else []
        cpu = [o["steady_cpu"] / (o["records"] - o["first_records"]) * 1e6 for o in outs
               if o.get("records", 0) > o.get("first_records", 0)]
        parent = [o["steady_parent_cpu"] / (o["records"] - o["first_records"]) * 1e6
                  for o in outs if o.get("records", 0) > o.get("first_records", 0)
                  and "steady_parent_cpu" in o]
        reads = [o.get("io", {}).get("reads", 0) for o in outs if "io" in o]
        mb = [o.get("cache", {}).get("tier_fetched_bytes", 0) / 1e6 for o in outs]
        waits = [o.get("cache", {}).get("tier_waits", 0) for o in outs]
        ttfb = [o["ttfb"] for o in outs if o.get("ttfb")]
        med = statistics.median
        print(f"| {name} | {_fmt([r for r in rates if r], 1e3, 1)} | {_fmt(ratio)} | "
              f"{_fmt(vs_exact)} | {_fmt(cpu, 1, 0)} | {_fmt(parent, 1, 1)} | "
              f"{med(reads) if reads else 0:,.0f} | "
              f"{med(mb) if gs else 0:.0f} | {med(waits) if gs else 0:.0f} | {_fmt(ttfb)} |")
    return 0


def profiled(raw: Path, out: dict[str, Any]) -> str | None:
    """The summary of a profiled child's samples (`profile_summary`); None when the child
    failed or timed out (its samples, if any, are of a run cut short) or wrote none."""
    if "error" in out or not raw.is_file():
        return None
    return profile_summary(raw, max(1, out.get("records", 0)))


def profile_summary(raw: Path, records: int, top: int = 20) -> str:
    """py-spy's raw samples (one line a stack: frames root first, `;`-joined, then a
    count), as the functions with the most samples on top of the stack and the most
    anywhere in it, each in samples and µs per record (at the sampling rate, 200 Hz)."""
    own: dict[str, int] = {}
    anywhere: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        k = int(n)
        total += k
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                  for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + k
        for f in set(frames):
            anywhere[f] = anywhere.get(f, 0) + k
    us = 1e6 / 200 / records

    def rows(d: dict[str, int]) -> list[str]:
        return [f"  {n:6d} {n * us:6.2f} µs/rec  {f})" for f, n in
                sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return "\n".join([f"{total} samples, {total * us:.1f} µs/record; own:", *rows(own),
                      "anywhere in the stack:", *rows(anywhere)])


if __name__ == "__main__":
    sys.exit(main())
