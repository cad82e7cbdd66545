"""An exact-shuffle epoch over Parquet files (`Dataset.from_parquet`) against the same rows as
ArrayRecord files (`from_arrayrecord`, each record the row's JSON, `json.loads` per record),
through the whole loader, batch 256.

The data: `--files` files of `--rows` rows each, ~1 KiB of text per row (id, label, title,
body), written by pyarrow with `--group-rows` rows per row group (snappy); the ArrayRecord
copy is what `ArrayRecordWriter` makes by default (group_size 1). Each round runs every
contender once, in turn, at workers 0 and 2; the table gives rows/s (median over rounds)
and each Parquet/ArrayRecord ratio taken within a round (median [min-max]). Also timed,
apart: a decoding process's CPU per row for Parquet (a row group decoded, its columns
converted to values, every row taken as a dict) against `json.loads` of the ArrayRecord
record (the ArrayRecord chunk's own decode not counted).

`PYTHONPATH=. python -m benchmarks.parquet_epoch [--files N] [--rows N] [--group-rows N]
[--rounds N]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _write(root: Path, files: int, rows: int, group_rows: int) -> tuple[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import aioloader as al

    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(5000)])
    for k in range(files):
        ids = np.arange(k * rows, (k + 1) * rows)
        body = [" ".join(rng.choice(words, 160)) for _ in ids]
        table = pa.table({"id": ids, "label": [f"c{i % 10}" for i in ids],
                          "title": [f"title {i}" for i in ids], "body": body})
        pq.write_table(table, root / f"part-{k:03d}.parquet", row_group_size=group_rows)
        with al.ArrayRecordWriter(root / f"part-{k:03d}.array_record") as w:
            for row in table.to_pylist():
                w.write(json.dumps(row).encode())
    return str(root / "part-*.parquet"), str(root / "part-*.array_record")


def _epoch(ds, workers: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    with ds.loader(workers=workers) as it:
        for batch in it:
            n += len(batch["id"])
    return n, time.perf_counter() - t0


def _per_row_cpu(pq_glob: str, ar_glob: str) -> tuple[float, float]:
    import aioloader as al

    with al.ParquetSource(pq_glob) as src:
        table, f = src.table, 0
        state = table.state(f, 1 << 30)
        ix = table.indices[f]
        data = Path(table.urls[f]).read_bytes()
        t0, rows = time.process_time(), 0
        for g in np.flatnonzero(ix.chunk_records > 0).tolist():
            start, end, n = (int(ix.chunk_offsets[g]), int(ix.chunk_ends[g]),
                             int(ix.chunk_records[g]))
            rows += len(state.rows(data[start:end], start,
                                   np.random.default_rng(g).permutation(n).tolist(),
                                   max_decoded=1 << 30))
        pq_cpu = (time.process_time() - t0) / rows
    with al.ArrayRecordSource(ar_glob) as src:
        records = src[list(range(min(rows, len(src))))]
        t0 = time.process_time()
        for r in records:
            json.loads(r)
        ar_cpu = (time.process_time() - t0) / len(records)
    return pq_cpu, ar_cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--group-rows", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import aioloader as al

    with tempfile.TemporaryDirectory() as tmp:
        pq_glob, ar_glob = _write(Path(tmp), args.files, args.rows, args.group_rows)
        contenders = {
            "parquet": al.Dataset.from_parquet(pq_glob).shuffle(seed=1).batch(256),
            "arrayrecord": al.Dataset.from_arrayrecord(ar_glob).shuffle(seed=1)
            .map(json.loads).batch(256),
        }
        rates: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for workers in (0, 2):
                for name, ds in contenders.items():
                    n, s = _epoch(ds, workers)
                    assert n == args.files * args.rows
                    rates.setdefault((name, workers), []).append(n / s)
        print("| workers | parquet rows/s | arrayrecord rows/s | parquet / arrayrecord |")
        print("|---|---|---|---|")
        for workers in (0, 2):
            p, a = rates[("parquet", workers)], rates[("arrayrecord", workers)]
            ratios = [x / y for x, y in zip(p, a)]
            print(f"| {workers} | {statistics.median(p):,.0f} | {statistics.median(a):,.0f} "
                  f"| {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] |")
        pq_cpu, ar_cpu = _per_row_cpu(pq_glob, ar_glob)
        print(f"\nCPU per row in a decoding process: parquet {pq_cpu * 1e6:.1f} us "
              f"(row group decode + dict), arrayrecord json.loads {ar_cpu * 1e6:.1f} us")


if __name__ == "__main__":
    main()
