"""How random is a block shuffle? Batches of the block shuffle against the exact shuffle.

    python -m benchmarks.shuffle_quality [--records 1000000] [--record-bytes 1024]
        [--labels 100] [--batch 256] [--processes 1 8]

A pure measurement (no files): the plan is compiled over a chunk table like group_size-1
files of `--record-bytes` records, whose labels come in sorted runs (records
`[k*n/labels, (k+1)*n/labels)` have label k: the worst case, a dataset written class by
class). For each shuffle it looks up 400 batches spread over an epoch and reports, per batch:
the distinct labels and their entropy (bits; exact ≈ log2 of the labels a batch can hold),
and the |original index distance| between neighbours in the batch, as a fraction of the
dataset (median and 10th percentile; an exact shuffle gives ≈ 0.29 and ≈ 0.05). With
processes > 1 the global batch (batch × processes, every process's share) is measured, and
the last column is process 0's own batch.
"""

from __future__ import annotations

import argparse

import numpy as np

import aioloader as al
from aioloader.describe.plan import SourceMeta, compile
from aioloader.index.planning import cut_runs
from aioloader.options import LoaderOptions

MiB = 1 << 20


def meta(n: int, record_bytes: int) -> SourceMeta:
    """One file of one-record chunks of `record_bytes` each."""
    ends = np.arange(1, n + 1, dtype=np.int64) * record_bytes
    starts = np.arange(n + 1, dtype=np.int64)

    def blocks(target: int) -> tuple[np.ndarray, np.ndarray]:
        runs = cut_runs(np.zeros(n, np.int64), ends - record_bytes, ends, target)
        return starts[runs.chunk], runs.end - runs.start

    return SourceMeta(n, starts, True, False, "headers", blocks)


def batches(ds: al.Dataset, m: SourceMeta, procs: int, batch: int, count: int):
    """`count` global batches spread over the first epoch, as arrays of record indices."""
    plans = [compile(ds, m, LoaderOptions(), procs=(p, procs) if procs > 1 else None)
             for p in range(procs)]
    steps = plans[0].length // batch
    out = []
    for k in np.linspace(0, steps - 1, count).astype(int):
        pos = np.arange(k * batch, (k + 1) * batch)
        out.append(np.concatenate([pl.index.lookup(pos)[0] for pl in plans]))
    return out


def measure(bs, n: int, labels: int) -> dict[str, float]:
    distinct, entropy, med, p10 = [], [], [], []
    for b in bs:
        lab = b * labels // n
        _, c = np.unique(lab, return_counts=True)
        p = c / c.sum()
        distinct.append(len(c))
        entropy.append(float(-(p * np.log2(p)).sum()))
        d = np.abs(np.diff(b)) / n
        med.append(float(np.median(d)))
        p10.append(float(np.percentile(d, 10)))
    return {"labels": float(np.mean(distinct)), "entropy": float(np.mean(entropy)),
            "dist_med": float(np.median(med)), "dist_p10": float(np.median(p10))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--labels", type=int, default=100)
    ap.add_argument("--batch", type=int, default=256, help="per process")
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--block-mib", type=float, default=4)
    ap.add_argument("--windows-mib", type=float, nargs="+", default=[16, 64, 256, 1024])
    args = ap.parse_args(argv)
    n, rb = args.records, args.record_bytes
    m = meta(n, rb)
    src = al.Dataset.from_arrayrecord("/synthetic")
    print(f"{n} records of {rb} B ({n * rb / MiB:.0f} MiB), {args.labels} labels in sorted "
          f"runs, block {args.block_mib:g} MiB, batch {args.batch} per process; 400 batches")
    print()
    print("| processes | shuffle | window | labels/batch | entropy (bits) "
          "| neighbour distance median | p10 | labels/process batch |")
    print("|---|---|---|---|---|---|---|---|")
    for procs in args.processes:
        shuffles = [("exact", "-", src.shuffle(1))]
        shuffles += [("block", f"{w:g} MiB", src.shuffle(
            1, strategy="block", block_bytes=int(args.block_mib * MiB),
            window_bytes=int(w * MiB))) for w in args.windows_mib]
        for name, window, ds in shuffles:
            if procs > 1:
                ds = ds.shard_by_jax_process()
            ds = ds.batch(args.batch)
            bs = batches(ds, m, procs, args.batch, 400)
            r = measure(bs, n, args.labels)
            local = measure([b[:args.batch] for b in bs], n, args.labels)["labels"]
            print(f"| {procs} | {name} | {window} | {r['labels']:.1f} | {r['entropy']:.2f} "
                  f"| {r['dist_med']:.4f} | {r['dist_p10']:.5f} | {local:.1f} |")


if __name__ == "__main__":
    main()
