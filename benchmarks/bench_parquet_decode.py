"""Decoding Parquet row groups from fetched bytes (aioloader.formats.parquet) against
`pyarrow.parquet.read_table` of the same file, in one process and one thread.

The file: `--rows` rows of ~1 KiB of text each (the pipeline benchmarks' 1 KiB JSON
records, as columns: id, label, title, body), `--group-rows` rows per row group, written by
pyarrow (`--compression`). Each round runs every contender once, in turn (A, B, C, D):

- read_table: `pq.read_table` of the whole file from memory (use_threads=False);
- ours, columns: every row group decoded from only its fetched ranges by one
  `RowGroupDecoder` (as a worker keeps one per file: the page walk, the budget, then
  pyarrow through the fetched-bytes file) into a Table;
- read_table + to_pylist: pyarrow's own rows as dicts, the peer for elements;
- ours, elements: the same row groups, then `rows(table)`: one dict per row, NumPy
  scalars for numbers.

Timed in CPU seconds of this process (one thread, so its CPU is its cost and a shared
machine's other jobs are left out) and in wall time; each ratio is taken within a round,
and the table shows the median [min–max] over rounds. The index step (tail, footer parse,
layout) is timed apart, once per round.

`PYTHONPATH=. python -m benchmarks.bench_parquet_decode [--rows N] [--group-rows N]
[--rounds N] [--compression C]`
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import statistics
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from aioloader.formats.parquet import (
    ParquetFileIndex,
    RowGroupDecoder,
    footer_from_tail,
    footer_range,
    parse_footer,
    read_layout,
    rows,
    tail_range,
)

from .common import text_records

BIG = 1 << 40
PATH = "bench.parquet"


def _file(n: int, group_rows: int, compression: str) -> bytes:
    records = [json.loads(r) for r in text_records(n)]
    table = pa.Table.from_pylist(records)
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=group_rows, compression=compression)
    return buf.getvalue()


def _open(data: bytes):
    size = len(data)
    o, n = tail_range(size)
    footer = footer_from_tail(PATH, size, data[o:o + n], max_bytes=BIG)
    if footer is None:  # longer than the tail: a second read, of its own range
        fo, fn = footer_range(PATH, size, data[o:o + n], max_bytes=BIG)
        footer = data[fo:fo + fn]
    parsed = parse_footer(PATH, size, footer, max_bytes=BIG)
    layout = read_layout(PATH, size, parsed, max_rows=BIG, max_bytes=BIG)
    return parsed.meta, layout, ParquetFileIndex.from_layout(layout)


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--group-rows", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--compression", default="snappy")
    args = ap.parse_args()

    data = _file(args.rows, args.group_rows, args.compression)
    meta, layout, index = _open(data)
    # what the fetch step hands a worker: each row group's ranges, as separate bytes objects
    fetched = [{o: data[o:o + n] for o, n in index.fetch_ranges(g)}
               for g in range(index.num_row_groups)]

    def ours_tables():
        decoder = RowGroupDecoder(layout, meta)  # a worker keeps one per file
        return [decoder.table(g, fetched[g], max_bytes=BIG)
                for g in range(index.num_row_groups)]

    def ours_elements():
        return [r for t in ours_tables() for r in rows(t)]

    contenders: dict[str, Callable[[], object]] = {
        "read_table": lambda: pq.read_table(pa.BufferReader(data), use_threads=False),
        "ours, columns": ours_tables,
        "read_table + to_pylist": lambda: pq.read_table(pa.BufferReader(data),
                                                        use_threads=False).to_pylist(),
        "ours, elements": ours_elements,
        "index step (footer + layout)": lambda: _open(data),
    }
    assert pa.concat_tables(ours_tables()).equals(pq.read_table(pa.BufferReader(data)))
    for fn in contenders.values():  # warm-up: allocator, page cache of the imports
        fn()
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    for r in range(args.rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            runs[name].append(_timed(contenders[name]))

    n = args.rows
    print(f"{n} rows of ~1 KiB, {index.num_row_groups} row groups of {args.group_rows}, "
          f"{args.compression}, {len(data) / 1e6:.1f} MB; {args.rounds} rounds, "
          "median [min–max]\n")
    print("| contender | k rows/s (wall) | CPU µs/row | rows/s ÷ peer's (wall) "
          "| peer's CPU ÷ ours |")
    print("|---|---:|---:|---:|---:|")
    peers = {"ours, columns": "read_table", "ours, elements": "read_table + to_pylist"}

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} [{min(xs):.2f}–{max(xs):.2f}]"

    for name, got in runs.items():
        walls, cpus = [w for w, _ in got], [c for _, c in got]
        rate = [n / w / 1e3 for w in walls]
        per_row = [c / n * 1e6 for c in cpus]
        ratio = cpu_ratio = "—"
        if name in peers:  # within each round
            ratio = med([pw / w for (w, _), (pw, _) in zip(got, runs[peers[name]])])
            cpu_ratio = med([pc / c for (_, c), (_, pc) in zip(got, runs[peers[name]])])
        if name.startswith("index"):
            print(f"| {name} | — | {med([c * 1e3 for c in cpus])} ms CPU per file | — | — |")
            continue
        print(f"| {name} | {med(rate)} | {med(per_row)} | {ratio} | {cpu_ratio} |")


if __name__ == "__main__":
    main()
