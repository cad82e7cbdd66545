"""`WriteToArrayRecord`: Beam's file-sink protocol for ArrayRecord shards, over fsspec.

The protocol is that of `apache_beam.io.iobase.WriteImpl` (which `FileBasedSink` builds on), but
through fsspec instead of Beam's `FileSystems`, so every URL the rest of aioloader reads (local
paths, gs:// with gcsfs, s3://, memory://, ...) works here too:

1. each worker writes its records to a fresh temporary file, uniquely named, in a hidden
   directory `.beam-temp-NAME-UUID` beside the output, and emits that name only when the file
   is complete. Beam keeps the emitted names of successful bundles only, so a bundle that fails
   halfway (and is retried) leaves just an orphaned temporary, never a shard;
2. one finalize step, after every write, renames the temporaries to
   `PREFIX-SSSSS-of-NNNNN.array_record` (empty shards are written for keys that got no record)
   and deletes the temporary directory, orphans included. A finalize that is itself retried
   skips the shards it already placed.

`num_shards=N` deals records to N keys round-robin (a shuffle, as in Beam's own sinks);
`num_shards=0` writes one shard per bundle, which avoids the shuffle and lets the runner pick
the count. Which record lands in which shard, and in what order, is the runner's business (a
PCollection has no order): read back, the multiset of records is what is guaranteed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import fsspec
from apache_beam.transforms import window
from apache_beam.utils import timestamp
from apache_beam.utils.windowed_value import WindowedValue

from ..arrayrecord import ArrayRecordWriter, parse_options
from ..tools.convert import shard_paths
from ..urls import is_local, redact

__all__ = ["WriteToArrayRecord", "finalize_shards", "temp_dir_for", "write_file"]

log = logging.getLogger("aioloader")


def url_fs(url: str, options: dict | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of `url` and the path within it."""
    return fsspec.core.url_to_fs(url, **(options or {}))


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def temp_dir_for(prefix: str) -> str:
    """A fresh hidden directory beside the output (globs for the shards never match it)."""
    head, _, name = prefix.rstrip("/").rpartition("/")
    if not name:
        raise ValueError(f"{redact(prefix)}: the output prefix needs a file name part")
    return f"{head}{'/' if head else ''}.beam-temp-{name}-{uuid.uuid4().hex}"


class _Shard:
    """One ArrayRecord file being written; `close()` makes it complete (and durable, locally:
    a name that is emitted names bytes on disk)."""

    def __init__(self, url: str, group_size: int, compression: str,
                 storage_options: dict | None = None) -> None:
        fs, path = url_fs(url, storage_options)
        self.local = is_local(url)
        if self.local:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.file = fs.open(path, "wb")
        self.writer = ArrayRecordWriter(self.file, group_size=group_size, compression=compression)

    def close(self) -> None:
        with self.file:
            self.writer.close()
            if self.local:
                self.file.flush()
                os.fsync(self.file.fileno())


def write_file(url: str, records: Iterable[bytes], group_size: int, compression: str,
               storage_options: dict | None = None) -> int:
    """Write one complete ArrayRecord file; returns the record count."""
    shard = _Shard(url, group_size, compression, storage_options)
    try:
        for record in records:
            shard.writer.write(record)
    except BaseException:
        shard.file.close()
        raise
    shard.close()
    return shard.writer.num_records


def finalize_shards(prefix: str, temp_dir: str, results: Sequence[tuple[int | None, str]],
                    num_shards: int, group_size: int, compression: str,
                    storage_options: dict | None = None) -> list[str]:
    """Rename the written temporaries into place; returns the shard paths (in order).

    `results` are `(shard key, temporary path)` of the successful writes; with `num_shards=0`
    the keys are None and the shards are numbered by temporary name. Idempotent: a shard whose
    temporary is gone but whose output exists was placed by an earlier attempt.
    """
    if num_shards:
        keys = [k for k, _ in results]
        if len(set(keys)) != len(keys):
            raise RuntimeError(f"{redact(prefix)}: a shard was written twice: {sorted(keys)}")  # type: ignore[type-var]
        temps: dict[int, str] = {int(k): p for k, p in results}  # type: ignore[arg-type]
    else:
        ordered = sorted(p for _, p in results)
        num_shards = max(1, len(ordered))
        temps = dict(enumerate(ordered))
    fs, _ = url_fs(prefix, storage_options)
    finals = shard_paths(prefix, num_shards)
    for k, final in enumerate(finals):
        src = temps.get(k)
        if src is None:  # a key that received no record: an empty, valid shard
            src = _join(temp_dir, f"empty-{k:05d}.array_record")
            write_file(src, (), group_size, compression, storage_options)
        if fs.exists(src):
            fs.mv(src, final)
        elif not fs.exists(final):
            raise FileNotFoundError(f"{redact(src)}: written, but neither it nor "
                                    f"{redact(final)} exists")
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.rm(temp_dir, recursive=True)
    log.info("wrote %d shards to %s", num_shards, redact(prefix))
    return finals


def _finalize(_: None, *args: Any) -> list[str]:
    return finalize_shards(*args)


class _RoundRobin(beam.DoFn):
    """Deal records to `count` keys, from a random start per bundle (as Beam's sinks do)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def start_bundle(self) -> None:
        self.next = int.from_bytes(os.urandom(4), "little") % self.count

    def process(self, record: bytes) -> Iterator[tuple[int, bytes]]:
        self.next = (self.next + 1) % self.count
        yield self.next, record


class _WriteShard(beam.DoFn):
    """One shard key's records to one temporary file; emits `(key, temporary path)`."""

    def __init__(self, temp_dir: str, *how: Any) -> None:
        self.temp_dir, self.how = temp_dir, how  # group size, compression, storage options

    def process(self, element: tuple[int, Iterable[bytes]]) -> Iterator[tuple[int, str]]:
        key, records = element
        path = _join(self.temp_dir, f"{key:05d}-{uuid.uuid4().hex}.array_record")
        write_file(path, records, *self.how)
        yield key, path


class _WriteBundle(beam.DoFn):
    """A bundle's records to one temporary file (`num_shards=0`); emits `(None, path)`."""

    def __init__(self, temp_dir: str, *how: Any) -> None:
        self.temp_dir, self.how = temp_dir, how  # group size, compression, storage options

    def start_bundle(self) -> None:
        self.path: str | None = None
        self.shard: _Shard | None = None

    def process(self, record: bytes) -> None:
        if self.shard is None:
            self.path = _join(self.temp_dir, f"{uuid.uuid4().hex}.array_record")
            self.shard = _Shard(self.path, *self.how)
        self.shard.writer.write(record)

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self.shard is None:
            return
        self.shard.close()
        self.shard = None
        yield WindowedValue((None, self.path), timestamp.MAX_TIMESTAMP, (window.GlobalWindow(),))

    def teardown(self) -> None:  # after a failed bundle: drop the orphan's handle
        if getattr(self, "shard", None) is not None:
            self.shard.file.close()  # type: ignore[union-attr]


class WriteToArrayRecord(beam.PTransform):
    """Write a PCollection of `bytes` as `PREFIX-SSSSS-of-NNNNN.array_record` files.

    `prefix` is a local path or any fsspec URL. `num_shards=0` writes one shard per bundle.
    The output PCollection holds the shard paths, once they are all in place.
    """

    def __init__(self, prefix: str, num_shards: int = 0, group_size: int = 1,
                 compression: str = "zstd:3", storage_options: dict | None = None) -> None:
        super().__init__()
        if num_shards < 0:
            raise ValueError("num_shards must be >= 0")
        parse_options(f"group_size:{group_size},{compression}")  # a bad option fails here
        self.prefix, self.num_shards = prefix, num_shards
        self.group_size, self.compression = group_size, compression
        self.storage_options = storage_options

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        temp_dir = temp_dir_for(self.prefix)
        args = (temp_dir, self.group_size, self.compression, self.storage_options)
        records = records | "Global" >> beam.WindowInto(window.GlobalWindows())
        if self.num_shards:
            written = (records
                       | "Deal" >> beam.ParDo(_RoundRobin(self.num_shards))
                       | "Group" >> beam.GroupByKey()
                       | "WriteShards" >> beam.ParDo(_WriteShard(*args)))
        else:
            written = records | "WriteBundles" >> beam.ParDo(_WriteBundle(*args))
        return (records.pipeline
                | "Once" >> beam.Create([None])
                | "Finalize" >> beam.FlatMap(_finalize, self.prefix, temp_dir,
                                             beam.pvalue.AsList(written), self.num_shards,
                                             self.group_size, self.compression,
                                             self.storage_options))
