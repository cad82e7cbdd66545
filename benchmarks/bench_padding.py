"""Padded batches: `batch(pad=...)` and `bucket_by_length` against padding in a `map()`
before `batch()` (what a pipeline had to do before), side by side on one file.

Records are int32 token sequences of 16..512 tokens (uniform), read from one local
ArrayRecord file; every contender decodes them the same way and yields batches of 64 with a
`tokens_mask`. Contenders run in turn within each repeat (`common.alternate`); the table
gives each one's epoch time and its ratio to the map() padding, min/median/max over repeats,
and the CPU time of the loader's own process (workers have exited when it is sampled).

`PYTHONPATH=. python -m benchmarks.bench_padding [--records 20000] [--repeats 5]
[--workers 2]`
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

import aioloader as al
from benchmarks.common import alternate, machine_info

LENGTH = 512
BATCH = 64


def decode(record: bytes) -> dict:
    return {"tokens": np.frombuffer(record, np.int32)}


def pad_in_map(element: dict) -> dict:
    tokens = element["tokens"]
    out = np.zeros(LENGTH, np.int32)
    out[: len(tokens)] = tokens
    return {"tokens": out, "tokens_mask": np.arange(LENGTH) < len(tokens)}


def n_tokens(element: dict) -> int:
    return len(element["tokens"])


def write(path: Path, n: int) -> str:
    rng = np.random.default_rng(0)
    with al.ArrayRecordWriter(str(path), group_size=1) as w:
        for _ in range(n):
            w.write(rng.integers(0, 1 << 20, int(rng.integers(16, LENGTH + 1)),
                                 dtype=np.int32).tobytes())
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp) / "tokens.array_record", args.records)
        ds = al.Dataset.from_arrayrecord(path).shuffle(0).map(decode)
        contenders = {
            "map() padding, batch()": ds.map(pad_in_map).batch(BATCH),
            "batch(pad={'tokens': 512})": ds.batch(BATCH, pad={"tokens": LENGTH}),
            "batch(pad=True)": ds.batch(BATCH, pad=True),
            "bucket_by_length(4 buckets)": ds.bucket_by_length(
                n_tokens, [64, 128, 256], [BATCH] * 4),
        }

        def epoch(d: al.Dataset):
            def run() -> int:
                with d.loader(workers=args.workers) as it:
                    return sum(len(b["tokens"]) for b in it)
            return run

        runs = alternate({k: epoch(d) for k, d in contenders.items()}, args.repeats)
    base = runs["map() padding, batch()"].wall
    print(machine_info())
    print(f"{args.records} records, batch {BATCH}, workers={args.workers}, "
          f"{args.repeats} repeats\n")
    print("| contender | epoch s (median) | ÷ map() padding [min–max] | parent CPU s (median) |")
    print("|---|---:|---:|---:|")
    for name, r in runs.items():
        ratios = [a / b for a, b in zip(r.wall, base)]
        print(f"| {name} | {statistics.median(r.wall):.2f} | "
              f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] | "
              f"{statistics.median(r.cpu):.2f} |")


if __name__ == "__main__":
    main()
