"""Convert record files (JSON lines, TFRecord, .npy, Parquet) to sharded ArrayRecord files.

Inputs are read in order and dealt round-robin to N shard writers, each on its own thread
(compression releases the GIL, so shards compress in parallel). Outputs are named
`PREFIX-00000-of-00008.array_record`, locally or at any fsspec URL. TFRecord is read without
TensorFlow: each record is `u64 length, u32 masked crc32c(length), data, u32 masked
crc32c(data)`, and both checksums are verified.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import fsspec

from .arrayrecord import ArrayRecordWriter

FORMATS = ("jsonl", "tfrecord", "npy", "parquet")


class ConvertError(ValueError):
    """Unreadable input: names the file, the byte offset or row, and what is wrong."""


def guess_format(path: str) -> str:
    name = path.lower().removesuffix(".gz")
    for suffix, fmt in ((".jsonl", "jsonl"), (".json", "jsonl"), (".ndjson", "jsonl"),
                        (".tfrecord", "tfrecord"), (".tfrecords", "tfrecord"),
                        (".npy", "npy"), (".parquet", "parquet")):
        if name.endswith(suffix) or f"{suffix}-" in name:
            return fmt
    raise ConvertError(f"{path}: cannot tell the input format from the name; pass --from")


def _masked_crc(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_tfrecord(f: IO[bytes], path: str, verify: bool = True) -> Iterator[bytes]:
    """Records of one TFRecord stream, checksums verified."""
    offset = 0
    while True:
        head = f.read(12)
        if not head:
            return
        if len(head) < 12:
            raise ConvertError(f"{path}: truncated record header at byte {offset}")
        length, length_crc = struct.unpack("<QI", head)
        if verify and _masked_crc(head[:8]) != length_crc:
            raise ConvertError(f"{path}: length checksum mismatch at byte {offset} (corrupted "
                               "file, or not TFRecord)")
        data = f.read(length)
        tail = f.read(4)
        if len(data) < length or len(tail) < 4:
            raise ConvertError(f"{path}: record at byte {offset} is truncated")
        if verify and _masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise ConvertError(f"{path}: data checksum mismatch in the record at byte {offset}")
        offset += 16 + length
        yield data


def write_tfrecord(f: IO[bytes], records: Sequence[bytes]) -> None:
    """Write TFRecord framing (tests and users preparing fixtures)."""
    for r in records:
        head = struct.pack("<Q", len(r))
        f.write(head + struct.pack("<I", _masked_crc(head)) + r
                + struct.pack("<I", _masked_crc(r)))


def _read_jsonl(f: IO[bytes], path: str) -> Iterator[bytes]:
    for n, line in enumerate(f, 1):
        line = line.rstrip(b"\r\n")
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError as exc:
            raise ConvertError(f"{path}: line {n} is not JSON ({exc})") from None
        yield line


def _read_npy(path: str) -> Iterator[bytes]:
    import numpy as np

    with fsspec.open(path, "rb") as f:
        arr = np.load(f, allow_pickle=False)
    if arr.ndim == 0:
        raise ConvertError(f"{path}: a scalar array has no rows to convert")
    for row in arr:
        yield np.ascontiguousarray(row).tobytes()


def _read_parquet(path: str) -> Iterator[bytes]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConvertError("reading Parquet needs pyarrow: pip install pyarrow") from None
    with fsspec.open(path, "rb") as f:
        table = pq.read_table(f)
    for batch in table.to_batches():
        for row in batch.to_pylist():
            yield json.dumps(row, default=str).encode()


def read_records(path: str, fmt: str) -> Iterator[bytes]:
    """The records of one input file, in order."""
    if fmt == "npy":
        yield from _read_npy(path)
        return
    if fmt == "parquet":
        yield from _read_parquet(path)
        return
    with fsspec.open(path, "rb", compression="infer") as f:
        if fmt == "jsonl":
            yield from _read_jsonl(f, path)
        elif fmt == "tfrecord":
            yield from read_tfrecord(f, path)
        else:
            raise ConvertError(f"unknown input format {fmt!r}; one of {FORMATS}")


def shard_paths(prefix: str, shards: int) -> list[str]:
    return [f"{prefix}-{k:05d}-of-{shards:05d}.array_record" for k in range(shards)]


def _remove(paths: Sequence[str]) -> None:
    for p in paths:
        try:
            fs, fpath = fsspec.core.url_to_fs(p)
            fs.rm(fpath)
        except (OSError, FileNotFoundError):
            pass


def convert(
    inputs: Sequence[str],
    output_prefix: str,
    *,
    fmt: str | None = None,
    shards: int = 1,
    group_size: int = 1,
    compression: str = "zstd:3",
    progress: Callable[[int, int], Any] | None = None,
) -> dict[str, Any]:
    """Convert `inputs` to `shards` ArrayRecord files; returns counts and output paths.

    `progress(records, bytes)` is called as records are written (from one thread).
    """
    if shards < 1:
        raise ValueError("shards must be >= 1")
    paths = shard_paths(output_prefix, shards)
    parent = os.path.dirname(output_prefix)
    if parent and "://" not in output_prefix:
        os.makedirs(parent, exist_ok=True)
    writers = [ArrayRecordWriter(p, group_size=group_size, compression=compression)
               for p in paths]
    queues: list[queue.Queue] = [queue.Queue(maxsize=256) for _ in range(shards)]
    errors: list[BaseException] = []

    def drain(k: int) -> None:
        try:
            while (item := queues[k].get()) is not None:
                writers[k].write(item)
            writers[k].close()
        except BaseException as exc:  # reported after the join
            errors.append(exc)
            while queues[k].get() is not None:  # keep the producer from blocking
                pass

    threads = [threading.Thread(target=drain, args=(k,), name=f"aioloader-convert-{k}")
               for k in range(shards)]
    for t in threads:
        t.start()
    count = size = 0
    ok = False
    try:
        for path in inputs:
            for record in read_records(path, fmt or guess_format(path)):
                queues[count % shards].put(record)
                count += 1
                size += len(record)
                if progress is not None and count % 1000 == 0:
                    progress(count, size)
                if errors:
                    break
        ok = not errors
    finally:
        for q in queues:
            q.put(None)
        for t in threads:
            t.join()
        if not ok:
            _remove(paths)  # no half-converted shards that look complete
    if errors:
        raise errors[0]
    if progress is not None:
        progress(count, size)
    return {"records": count, "bytes": size, "outputs": paths}
