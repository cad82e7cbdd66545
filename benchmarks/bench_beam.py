"""JSON lines -> ArrayRecord: `aioloader convert` (one process) against the same conversion
on Apache Beam's local runner, multi-process (issue 18).

    python -m benchmarks.bench_beam [--records 1000000] [--files 4] [--repeats 3]

Each contender is the command a user would type, run as a child process (interpreter start
and imports included), in turn within every repeat (A, B, C, A, B, C, ...); wall time,
records/s, and CPU seconds of the child and everything it started (Beam's worker processes
included). Inputs are `--files` JSON-lines files of the house 1 KiB text records; outputs go
to `--files` shards in every contender, zstd:3, group size 1.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import log, machine_info, text_records


def _write_inputs(root: Path, records: int, files: int) -> list[str]:
    base = text_records(min(records, 100_000))  # the text generator is slow; reuse its output
    paths = []
    for j in range(files):
        path = root / f"in-{j:02d}.jsonl"
        with open(path, "wb") as f:
            for i in range(j, records, files):
                f.write(base[i % len(base)] + b"\n")
        paths.append(str(path))
    return paths


def _run(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed:\n{proc.stderr.decode()[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="Beam's direct_num_workers")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="aioloader-bench-beam-"))
    try:
        log(f"writing {args.records:,} records to {args.files} JSON-lines files in {root}")
        inputs = _write_inputs(root, args.records, args.files)
        size = sum(Path(p).stat().st_size for p in inputs)
        cli = [sys.executable, "-m", "aioloader.tools.cli", "convert", *inputs]
        beam = ["--runner", "beam", "--", f"--direct_num_workers={args.workers}",
                "--direct_running_mode=multi_processing"]
        contenders = {
            "convert (1 process, threads)": [*cli, "OUT", "--shards", str(args.files), "-q"],
            f"beam, {args.workers} procs, one shard per input": [
                *cli, "OUT", "--match-shards", *beam],
            f"beam, {args.workers} procs, dealt to {args.files} shards": [
                *cli, "OUT", "--shards", str(args.files), *beam],
        }
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
        for r in range(args.repeats):
            for name, cmd in contenders.items():
                out = root / f"out-{r}-{len(runs[name])}"
                cmd = [str(out / "t") if c == "OUT" else c for c in cmd]
                runs[name].append(_run(cmd))
                shutil.rmtree(out, ignore_errors=True)
                log(f"repeat {r}: {name}: {runs[name][-1][0]:.1f} s")
        print(machine_info())
        print(f"\n{args.records:,} JSON-line records ({size / 1e9:.2f} GB) in {args.files} "
              f"files -> {args.files} ArrayRecord shards, median [min-max] of "
              f"{args.repeats}\n")
        print("| contender | wall s | records/s | CPU s | CPU µs / record |")
        print("|---|---:|---:|---:|---:|")
        for name, rs in runs.items():
            walls, cpus = [w for w, _ in rs], [c for _, c in rs]
            w, c = statistics.median(walls), statistics.median(cpus)
            print(f"| {name} | {w:.1f} [{min(walls):.1f}-{max(walls):.1f}] | "
                  f"{args.records / w:,.0f} | {c:.1f} | {c / args.records * 1e6:.1f} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
