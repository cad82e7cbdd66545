"""Shared helpers for format tests: local range fetch, record generators, the oracle."""

from __future__ import annotations

import os
import random

from aioloader.arrayrecord import RangeReader

CODECS = ["uncompressed", "zstd:3", "brotli:6", "snappy"]
GROUP_SIZES = [1, 64, 1000]
# (label, record size, count): tiny and empty records in many groups, big ones crossing blocks
RECORD_SHAPES = [
    ("empty", 0, 1100),
    ("tiny", 7, 2100),
    ("1KiB", 1024, 300),
    ("70KB", 70_000, 4),
    ("200KB", 200_000, 3),
]


def write_noise(path, count: int, size: int) -> list[str]:
    """`count` records of `size` random bytes (incompressible) in one group-size-1 file at
    `path`, written by our writer; the path as a one-file list, as `from_arrayrecord` takes."""
    import numpy as np

    import aioloader as al

    rng = np.random.default_rng(0)
    with al.ArrayRecordWriter(path, group_size=1) as w:
        for _ in range(count):
            w.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return [str(path)]


def make_records(size: int, count: int, seed: int = 0) -> list[bytes]:
    """Half-compressible records: a random head and a repeated tail, sizes varying a little."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = max(0, size + (rng.randint(-size // 8, size // 8) if size >= 16 else 0))
        head = rng.randbytes(min(n, 64))
        out.append((head + b"abcdefgh" * (n // 8 + 1))[:n])
    return out


class LocalFile:
    """A read-only local file with a counting pread, for RangeReader."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        self.calls = 0

    def fetch(self, offset: int, length: int) -> bytes:
        self.calls += 1
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        os.close(self.fd)

    def reader(self, **kw) -> RangeReader:
        return RangeReader(self.fetch, self.size, path=self.path, **kw)


def read_all_ours(path, **kw) -> list[bytes]:
    f = LocalFile(path)
    try:
        return list(f.reader(**kw))
    finally:
        f.close()


def write_theirs(path, records, options: str) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    w = ArrayRecordWriter(os.fspath(path), options)
    for r in records:
        w.write(r)
    w.close()


def read_theirs(path) -> list[bytes]:
    from array_record.python.array_record_module import ArrayRecordReader

    r = ArrayRecordReader(os.fspath(path))
    try:
        return r.read_all() if r.num_records() else []
    finally:
        r.close()
