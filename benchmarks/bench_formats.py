"""`formats`: the text workload read from TFRecord files against the same records as
ArrayRecord files, and against Grain over the ArrayRecord copy; and what TFRecord's first
scan costs.

- rates: global shuffle → json.loads → batch 256 over 20 shards, each contender the best of
  workers 1 and 2 per repeat (Grain: threads 1 and 4); TFRecord's files are opened through
  a warm index cache (`index_cache_dir`), so the rate is the one after the first scan. The
  ArrayRecord copy is what `array_record`'s writer makes by default (zstd:3, group_size 1).
- first scan: opening the 20 TFRecord shards without an index cache (a sequential read of
  every byte and a parse of every length header) against opening the ArrayRecord shards'
  footers, both from the page cache, alternating; reported per GB of TFRecord.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .bench_pipeline import (
    SHARDS,
    TEXT_BYTES,
    _alternate_specs,
    _best_per_repeat,
    _runs,
    _spec,
    reps,
    sizes,
)
from .common import (
    GEN_VERSION,
    GENERATORS,
    Row,
    Stats,
    _records_from_cache,
    data_dir,
    log,
    register,
    sharded_dataset,
    throughput_row,
)


def tfrecord_shards(args: Any, n: int, shards: int) -> list[Path]:
    """The text records of `sharded_dataset(args, "text", n, shards)` as TFRecord files
    (shard k: the same records as ArrayRecord shard k), cached beside them."""
    from aioloader.formats.tfrecord import frame

    folder = data_dir(args) / f"text-n{n}-s{shards}-tfrecord-v{GEN_VERSION}"
    paths = [folder / f"text-{k:05d}-of-{shards:05d}.tfrecord" for k in range(shards)]
    if (folder / ".complete").exists():
        return paths
    records = _records_from_cache(args, "text", n) or GENERATORS["text"](n)
    log(f"writing {folder.name}/ ({shards} shards)")
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [k * n // shards for k in range(shards + 1)]
    for k, path in enumerate(paths):
        path.write_bytes(b"".join(frame(r) for r in records[bounds[k] : bounds[k + 1]]))
    (folder / ".complete").touch()
    return paths


def _open_seconds(paths: list[Path], kind: str) -> float:
    import aioloader as al

    src_type = al.TFRecordSource if kind == "tfrecord" else al.ArrayRecordSource
    t = time.perf_counter()
    with src_type([str(p) for p in paths]) as src:
        len(src)
    return time.perf_counter() - t


@register("formats", "TFRecord read directly vs the same data as ArrayRecord, and vs Grain",
          peer="ArrayRecord / Grain")
def run_formats(args: Any) -> list[Row]:
    n = sizes(args)["text"]
    ar = sharded_dataset(args, "text", n, SHARDS)
    tf = tfrecord_shards(args, n, SHARDS)
    r = reps(args)
    cache = tempfile.mkdtemp(prefix="aioloader-bench-index-")
    tf_kw = dict(format="tfrecord", index_cache_dir=cache)
    specs = {
        "tf1": (_spec("aioloader", tf, "decode_text", workers=1, **tf_kw), False),
        "ar1": (_spec("aioloader", ar, "decode_text", workers=1), False),
        "N1": (_spec("grain", ar, "decode_text", threads=1), False),
        "tf2": (_spec("aioloader", tf, "decode_text", workers=2, **tf_kw), False),
        "ar2": (_spec("aioloader", ar, "decode_text", workers=2), False),
        "N4": (_spec("grain", ar, "decode_text", threads=4), False),
    }
    log("formats: TFRecord (index cached) vs ArrayRecord vs Grain, alternating")
    try:
        res = _alternate_specs(specs, r, warmup=("tf1", "ar1", "N1"))  # (warm-up: the scan)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    tf_best, _ = _best_per_repeat(res, ["tf1", "tf2"])
    ar_best, _ = _best_per_repeat(res, ["ar1", "ar2"])
    grain_best, _ = _best_per_repeat(res, ["N1", "N4"])
    label = f"text 1 KiB, {SHARDS} shards of {n // 1000}k records, shuffle → json.loads"
    rows = [
        throughput_row(f"{label}: TFRecord ÷ ArrayRecord (zstd:3)", _runs(tf_best),
                       _runs(ar_best), 1.0, "rec/s", TEXT_BYTES,
                       "both aioloader, best of workers 1/2 per repeat; TFRecord through "
                       "a warm index cache"),
        throughput_row(f"{label}: TFRecord ÷ Grain over the ArrayRecord copy",
                       _runs(tf_best), _runs(grain_best), 1.0, "rec/s", TEXT_BYTES,
                       "Grain best of threads 1/4 per repeat"),
    ]
    gb = sum(p.stat().st_size for p in tf) / 1e9
    scans, opens = [], []
    log("formats: first scan vs footer open")
    _open_seconds(tf, "tfrecord")  # the files into the page cache
    for _ in range(max(r, 3)):
        scans.append(_open_seconds(tf, "tfrecord"))
        opens.append(_open_seconds(ar, "arrayrecord"))
    per_gb = [s / gb for s in scans]
    rows.append(Row(f"first scan of {SHARDS} TFRecord shards ({gb * 1e3:.0f} MB, page cache), "
                    "no index cache", "s/GB", Stats.of(per_gb),
                    note=f"ArrayRecord footers of the same records: median "
                    f"{statistics.median(opens) * 1e3:.0f} ms in all; TFRecord scan median "
                    f"{statistics.median(scans) * 1e3:.0f} ms"))
    return rows
