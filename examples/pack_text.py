"""Seed 002's text pipeline: parse -> tokenize -> shuffle -> repeat -> shard -> pack -> batch.

    python examples/pack_text.py [GLOB] [--batches N]
"""

from __future__ import annotations

import argparse

import numpy as np
from common import only_tokens, parse

import aioloader as al


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("glob", nargs="?", default="data/sample/train-*.array_record")
    p.add_argument("--batches", type=int, default=5)
    args = p.parse_args()

    ds = (al.Dataset.from_arrayrecord(args.glob)
          .shuffle(seed=42).repeat(2).shard(0, 1)
          .map(parse).map(only_tokens)
          .pack({"tokens": 128}, num_packing_bins=8)
          .batch(16, drop_remainder=True))
    with ds.loader(workers=1) as it:
        for k, batch in enumerate(it):
            seg = batch["tokens_segment_ids"]
            fill = float((seg > 0).mean())
            print(f"batch {k}: tokens {batch['tokens'].shape}, "
                  f"{int(seg.max(axis=1).sum())} sequences, {100 * fill:.0f}% filled")
            if k + 1 == args.batches:
                break
        state = it.get_state()
    print("state:", state)
    # The state resumes exactly, packing included.
    again = next(iter(ds.loader(state=state)))
    print("next batch after resume:", again["tokens"].shape,
          f"{int(np.count_nonzero(again['tokens_segment_ids']))} tokens")


if __name__ == "__main__":
    main()
