"""`python -m benchmarks run [--quick] [--only NAME]`: run the registered benchmarks, print tables.

`python -m benchmarks headline [--quick] [--write] [--from-json FILE]`: the headline table at the
top of RESULTS.md (benchmarks/headline.py).

One entry point so every figure in RESULTS.md comes from a command anyone can rerun
(`make bench`, `make bench-quick`). Progress goes to stderr; the machine line and the markdown
tables go to stdout (and to --output, if given).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

from .common import (
    DEFAULT_DATA_DIR,
    aioloader_info,
    format_table,
    load_all,
    log,
    machine_info,
)


def build_parser(names: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "aioloader against its peers, side by side in one run. Every figure is the median "
            "[min–max] over repeats; contenders alternate within each repeat (A, B, A, B...) and "
            "the ratio aioloader ÷ peer is taken per repeat, because absolute figures on shared "
            "machines drift by ±25%."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="benchmarks: " + ", ".join(names) + "\n\nexamples:\n"
               "  python -m benchmarks run --quick             # everything, small (< 10 min)\n"
               "  python -m benchmarks run --only format       # one benchmark, full size\n"
               "  python -m benchmarks run --output results.md # also write the tables\n"
               "  python -m benchmarks headline --write         # RESULTS.md's headline table",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run benchmarks and print their tables",
                         description="Run benchmarks and print their tables (markdown).")
    run.add_argument("--quick", action="store_true",
                     help="small datasets and fewer repeats: a smoke test, < 10 minutes")
    run.add_argument("--only", action="append", choices=names, metavar="NAME",
                     help=f"run only this benchmark (repeatable); one of: {', '.join(names)}")
    run.add_argument("--repeats", type=int, default=None, metavar="N",
                     help="timed repeats per measurement (default: 7 for format, 5 for "
                          "pipelines, fewer for the slow peers; 3 or fewer with --quick)")
    run.add_argument("--verify-workers", type=int, action="append", default=None, metavar="W",
                     help="worker counts for the verify benchmark (repeatable; default 2 and 0)")
    run.add_argument("--aio-workers", type=int, default=None, metavar="W",
                     help="aioloader's workers in loop and large-group (default: the best "
                          "found by pipeline in the same run, else 1); pin it to compare runs")
    run.add_argument("--grain-threads", type=int, default=None, metavar="N",
                     help="Grain's threads in loop (default: the best found by pipeline in "
                          "the same run, else 1)")
    run.add_argument("--rows", type=int, default=None, metavar="N",
                     help="parquet: rows in all, in 20 files (default 200000; 20000 with "
                          "--quick)")
    run.add_argument("--group-rows", type=int, default=None, metavar="N",
                     help="parquet: rows per row group of the generated files (default 1000; "
                          "0: pyarrow's default)")
    run.add_argument("--shuffle-buffer", type=int, default=None, metavar="N",
                     help="parquet: Grain's and Hugging Face's shuffle buffer, in rows "
                          "(default 10000)")
    run.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                     help=f"where generated datasets are cached (default {DEFAULT_DATA_DIR})")
    run.add_argument("--output", type=Path, default=None, metavar="FILE",
                     help="also write the machine line, command and tables to FILE")
    run.add_argument("--json", type=Path, default=None, metavar="FILE",
                     help="also write every row's figures to FILE as JSON (for "
                          "benchmarks/compare_trees.py)")
    sub.add_parser("list", help="list the registered benchmarks")
    from .headline import add_arguments

    headline = sub.add_parser(
        "headline", help="the headline table of RESULTS.md (one row per headline workload)",
        description="Run the headline workloads side by side and print RESULTS.md's headline "
                    "table; --write puts it at the top of RESULTS.md.")
    add_arguments(headline)
    return parser


def main(argv: list[str] | None = None) -> int:
    registry = load_all()
    from . import bench_scale  # noqa: F401  (registers "scale", issue 15's acceptance, last)
    args = build_parser(sorted(registry)).parse_args(argv)
    if args.command == "headline":
        from .headline import run as run_headline

        return run_headline(args, sys.argv[1:] if argv is None else argv)
    if args.command == "list":
        for bench in registry.values():
            print(f"{bench.name:12} {bench.description} (peer: {bench.peer})")
        return 0
    if args.repeats is not None and args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    command = "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv)
    header = [f"Machine: {machine_info()}", "", f"Command: `{command}`", "",
              f"aioloader: {aioloader_info()}", ""]
    print("\n".join(header), flush=True)
    parts = list(header)
    start = time.perf_counter()
    results = []
    for name in args.only or list(registry):
        bench = registry[name]
        rows = bench.run(args)
        table = format_table(bench, rows)
        print(table + "\n", flush=True)
        parts += [table, ""]
        results.append({"bench": name, "peer": bench.peer,
                        "rows": [dataclasses.asdict(r) for r in rows]})
    log(f"all done in {time.perf_counter() - start:.0f} s")
    if args.output:
        args.output.write_text("\n".join(parts))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "command": command,
                                         "aioloader": aioloader_info(),
                                         "benchmarks": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
