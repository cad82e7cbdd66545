"""What checking chunk data hashes costs a whole pipeline: verify="all" (the default) against
"headers" (the default before it, header hashes only).

The `pipeline` benchmark's text and image workloads (global shuffle → decode → batch 256 from
local files, 20 shards, group_size 1), run by aioloader alone at both verify levels, side by
side: within each repeat the two levels run back to back, in an order that flips every repeat
(A B, B A, ...), and the ratio all ÷ headers is taken per repeat, so the drift of a shared
machine hits both. A ratio of 0.97 means checking data hashes costs 3% of the throughput.

`python -m benchmarks run --only verify [--repeats N] [--quick]`; `--verify-workers` picks the
loader's worker counts (default 2, the best configuration in the pipeline table, and 0, where
the main process hashes and decodes alone).
"""

from __future__ import annotations

import gc
from typing import Any

from .bench_pipeline import BATCH, IMG_BYTES, SHARDS, TEXT_BYTES, reps, sizes
from .common import Row, Runs, log, register, sharded_dataset, throughput_row
from .contenders import run as run_pipeline

LEVELS = ("headers", "all")


def _spec(paths: list[str], decode: str, workers: int, verify: str) -> dict[str, Any]:
    return {"lib": "aioloader", "paths": paths, "decode": decode, "batch": BATCH, "seed": 0,
            "workers": workers, "verify": verify}


def compare(paths: list[str], decode: str, workers: int,
            repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Each verify level once per repeat, alternating which goes first; one untimed warm-up."""
    out: dict[str, list[dict[str, Any]]] = {v: [] for v in LEVELS}
    for v in LEVELS:
        run_pipeline(_spec(paths, decode, workers, v))
    for k in range(repeats):
        for v in (LEVELS if k % 2 == 0 else LEVELS[::-1]):
            gc.collect()
            out[v].append(run_pipeline(_spec(paths, decode, workers, v)))
    return out


def _runs(results: list[dict[str, Any]]) -> Runs:
    return Runs([r["wall"] / r["records"] for r in results],
                [r["cpu"] / r["records"] for r in results])


@register("verify", 'pipeline throughput with data hashes checked (verify="all") against '
                    'header hashes only ("headers")', peer='verify="headers"')
def run_verify(args: Any) -> list[Row]:
    n = sizes(args)
    r = reps(args, 7, 3)
    text = [str(p) for p in sharded_dataset(args, "text", n["text"], SHARDS)]
    img = [str(p) for p in sharded_dataset(args, "img", n["img"], SHARDS)]
    workloads = [
        (f"text 1 KiB, {SHARDS} shards, json.loads", text, "decode_text", TEXT_BYTES),
        (f"text 1 KiB, {SHARDS} shards, no decode", text, "identity", TEXT_BYTES),
        (f"img 64 KiB, {SHARDS} shards, np.frombuffer.reshape", img, "decode_image",
         IMG_BYTES),
    ]
    rows = []
    for workers in getattr(args, "verify_workers", None) or (2, 0):
        for label, paths, decode, unit in workloads:
            log(f"verify: {label}, workers={workers}")
            res = compare(paths, decode, workers, r)
            rows.append(throughput_row(
                f'{label}, verify="all" vs "headers"', _runs(res["all"]),
                _runs(res["headers"]), 1.0, "rec/s", unit,
                f"workers={workers}; ratio < 1 is the cost of checking data hashes"))
    return rows
