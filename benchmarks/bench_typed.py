"""Per-record CPU of `decode="auto"` (ElementSpec.decode) against what users write by hand.

Records held in memory (no I/O): a 64x64x3 uint8 image (one unnamed array: the record is its
raw bytes) and a 4-field Example-like dict (image bytes, int label, float[128] embedding,
int64[-1] tokens). Hand-written: `np.frombuffer(r, dtype).reshape(shape)` (a read-only view)
and the same plus `.copy()` (what decode returns: a fresh writable array). Rounds alternate
the contenders (ABAB); reports the median and range of µs per record over the rounds.

    python -m benchmarks.bench_typed [--rounds 9] [--n 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from aioloader.elements.typed import ElementSpec


def _per_record(fn, records) -> float:
    t = time.process_time()
    for r in records:
        fn(r)
    return (time.process_time() - t) / len(records) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    img = ElementSpec.array("|u1", (64, 64, 3))
    imgs = [rng.integers(0, 255, (64, 64, 3), np.uint8).tobytes() for _ in range(args.n)]
    ex = ElementSpec.of({"image": ("bytes", ()), "label": ("int64", ()),
                         "emb": ("float32", (128,)), "tokens": ("int64", (-1,))})
    exs = [ex.encode({"image": b"x" * 2000, "label": k, "emb": np.ones(128, np.float32),
                      "tokens": np.arange(k % 50)}) for k in range(args.n)]

    def by_hand(r):
        return np.frombuffer(r, np.uint8).reshape(64, 64, 3)

    def by_hand_copy(r):
        return np.frombuffer(r, np.uint8).reshape(64, 64, 3).copy()

    contenders = {"image: frombuffer.reshape": (by_hand, imgs),
                  "image: frombuffer.reshape.copy": (by_hand_copy, imgs),
                  "image: ElementSpec.decode": (img.decode, imgs),
                  "4-field dict: ElementSpec.decode": (ex.decode, exs)}
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, (fn, recs) in contenders.items():
            times[name].append(_per_record(fn, recs))
    print("| decode | µs/record, median [min–max] |\n|---|---:|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} [{min(ts):.2f}–{max(ts):.2f}] |")


if __name__ == "__main__":
    main()
