"""`formats`: the text workload read from TFRecord files against the same records as
ArrayRecord files, and against Grain over the ArrayRecord copy; `formats-scan`: what
TFRecord's first scan costs.

- rates: global shuffle → json.loads → batch 256 over 20 shards, each contender the best of
  workers 1 and 2 per repeat (Grain: threads 1 and 4); TFRecord's files are opened through
  a warm index cache (`index_cache_dir`), so the rate is the one after the first scan. The
  ArrayRecord copy is what `array_record`'s writer makes by default (zstd:3, group_size 1).
- first scan: opening the 20 TFRecord shards without an index cache (a sequential read of
  every byte and a parse of every length header) against opening the ArrayRecord shards'
  footers, alternating; reported per GB of TFRecord: from the page cache, and 4 shards of
  each from the local GCS emulator (its delay line in a process of its own, no latency
  added: what the client's sequential window reads cost, not a real bucket's bandwidth).
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


def _open_seconds(paths: list[Path] | list[str], kind: str, **kw: Any) -> float:
    import aioloader as al

    src_type = al.TFRecordSource if kind == "tfrecord" else al.ArrayRecordSource
    t = time.perf_counter()
    with src_type([str(p) for p in paths], **kw) as src:
        len(src)
    return time.perf_counter() - t


def _scan_row(label: str, tf: list[Path], ar: list[Path], rounds: int,
              urls: tuple[list[str], list[str]] | None = None, **kw: Any) -> Row:
    """Opening `tf` (a scan) against opening `ar` (footers), alternating; per GB of `tf`."""
    gb = sum(p.stat().st_size for p in tf) / 1e9
    tf_at, ar_at = urls if urls is not None else (tf, ar)
    scans, opens = [], []
    _open_seconds(tf_at, "tfrecord", **kw)  # (the page cache, the client's connections)
    for _ in range(rounds):
        scans.append(_open_seconds(tf_at, "tfrecord", **kw))
        opens.append(_open_seconds(ar_at, "arrayrecord", **kw))
    return Row(f"{label}: first scan of {len(tf)} TFRecord shards ({gb * 1e3:.0f} MB), no "
               "index cache", "s/GB", Stats.of(s / gb for s in scans),
               note=f"opening the ArrayRecord copy's footers: median "
                    f"{statistics.median(opens) * 1e3:.0f} ms in all; the scan: median "
                    f"{statistics.median(scans) * 1e3:.0f} ms")


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
    return rows


@register("formats-scan", "what TFRecord's first scan costs, locally and from a bucket",
          peer="ArrayRecord footers")
def run_formats_scan(args: Any) -> list[Row]:
    n = sizes(args)["text"]
    ar = sharded_dataset(args, "text", n, SHARDS)
    tf = tfrecord_shards(args, n, SHARDS)
    r = reps(args)
    rows = [_scan_row("local files (page cache)", tf, ar, max(r, 3))]
    from aioloader.testing import local_gcs

    few = slice(0, 4)  # (the emulator holds them in memory)
    with local_gcs(proxy_process=True) as gcs:
        log("formats: uploading shards to the emulated bucket")
        tf_urls = [gcs.upload(p, f"tf/{p.name}") for p in tf[few]]
        ar_urls = [gcs.upload(p, f"ar/{p.name}") for p in ar[few]]
        rows.append(_scan_row("emulated bucket (0 ms added)", tf[few], ar[few], max(r, 3),
                              (tf_urls, ar_urls), storage_options=gcs.storage_options))
    return rows
