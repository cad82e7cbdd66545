"""CPU per record of a worker's decode (`Decoder.records`) at each verify level, interleaved.

Standalone: `python -m benchmarks.verify_decoder [--rounds N] [--data-dir DIR]`. Reads one
shard of the `verify` benchmark's text and image datasets (written by array_record, group
size 1, zstd:3, in the page cache) in a shuffled order, the way a worker decodes a task, and
times each variant by the CPU time of this process, in turn within each round (the order
rotating), so a loaded machine slows all of them alike:

- `headers`: the old default (block and chunk header hashes only);
- `all`: the default (data hashes too, two chunks' in lockstep: `hash64_pair`);
- `all, one at a time`: the same path with `hash64_pair` replaced by two `hash64` calls,
  i.e. what checking data hashes cost before they were paired.

Prints µs per record (median [min-max] over rounds) and each variant's cost over `headers`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from aioloader.arrayrecord import read_index
from aioloader.arrayrecord.hashing import _pair_fallback, highwayhash64_pair
from aioloader.index.planning import ChunkRefs
from aioloader.workers import ones
from aioloader.workers.decode import Decoder

from .bench_pipeline import SHARDS
from .common import sharded_dataset

VARIANTS = ("headers", "all", "all, one at a time")


def _refs(path: Path) -> ChunkRefs:
    data = path.read_bytes()
    ix = read_index(len(data), lambda o, n: data[o : o + n], path=str(path))
    order = np.arange(len(ix.chunk_offsets))
    random.Random(0).shuffle(order)  # type: ignore[arg-type]
    n = len(order)
    return ChunkRefs(paths=[str(path)], file=np.zeros(n, np.int64), chunk=order,
                     start=ix.chunk_offsets[order], end=ix.chunk_ends[order],
                     within=np.zeros(n, np.int64), count=ix.chunk_records[order])


def _time(dec: Decoder, refs: ChunkRefs, variant: str, passes: int) -> float:
    ones.highwayhash64_pair = _pair_fallback if variant.endswith("time") else highwayhash64_pair
    verify = variant.split(",")[0]
    t0 = time.process_time()
    for _ in range(passes):
        dec.records(refs, None, verify=verify)
    return (time.process_time() - t0) / (passes * len(refs.start)) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--data-dir", type=Path, default=None)
    args = p.parse_args()
    ns: Any = argparse.Namespace(data_dir=args.data_dir, quick=False)
    for kind, n, passes in (("text", 200_000, 3), ("img", 20_000, 3)):
        refs = _refs(sharded_dataset(ns, kind, n, SHARDS)[0])
        dec = Decoder()
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for v in VARIANTS:
            _time(dec, refs, v, 1)  # warm-up
        for r in range(args.rounds):
            for v in VARIANTS[r % 3:] + VARIANTS[: r % 3]:
                times[v].append(_time(dec, refs, v, passes))
        dec.close()
        base = times["headers"]
        print(f"{kind}: {len(refs.start)} records of one shard, {args.rounds} rounds")
        for v in VARIANTS:
            t = times[v]
            cost = [a / b - 1 for a, b in zip(t, base)]
            print(f"  {v:20s} {statistics.median(t):7.2f} us/rec [{min(t):.2f}-{max(t):.2f}]"
                  f"  cost vs headers {statistics.median(cost):+.1%} "
                  f"[{min(cost):+.1%}..{max(cost):+.1%}]")


if __name__ == "__main__":
    main()
