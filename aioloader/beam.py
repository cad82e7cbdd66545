"""Apache Beam I/O for ArrayRecord: `WriteToArrayRecord` (a sink) and `ReadFromArrayRecord`.

The only module that imports apache_beam (the `beam` extra); nothing imports it back.

Writing follows Beam's file-sink protocol (`apache_beam.io.iobase.WriteImpl`, which
`FileBasedSink` builds on) but through fsspec instead of Beam's `FileSystems`, so every URL the
rest of aioloader reads (local paths, gs:// with gcsfs, s3://, memory://, ...) works here too:

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

Reading is a `BoundedSource` per file whose positions are record indices: initial splits cut
at chunk boundaries (no chunk is decoded by two bundles), and the `OffsetRangeTracker` claims
record by record, so runners may split dynamically (Dataflow's work rebalancing) at any record.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import fsspec
from apache_beam.io import iobase
from apache_beam.io.concat_source import ConcatSource
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.transforms import window
from apache_beam.utils import timestamp
from apache_beam.utils.windowed_value import WindowedValue

from .arrayrecord import ArrayRecordWriter, FileIndex, RangeReader, parse_options
from .convert import shard_paths
from .urls import has_glob, is_local, redact

__all__ = ["ReadFromArrayRecord", "WriteToArrayRecord", "finalize_shards", "shard_paths"]

log = logging.getLogger("aioloader")


def _fs(url: str, options: dict | None = None) -> tuple[Any, str]:
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
        fs, path = _fs(url, storage_options)
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
            raise RuntimeError(f"{redact(prefix)}: a shard was written twice: {sorted(keys)}")
        temps: dict[int, str] = {int(k): p for k, p in results}  # type: ignore[arg-type]
    else:
        ordered = sorted(p for _, p in results)
        num_shards = max(1, len(ordered))
        temps = dict(enumerate(ordered))
    fs, _ = _fs(prefix, storage_options)
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
        yield WindowedValue((None, self.path), timestamp.MAX_TIMESTAMP, [window.GlobalWindow()])

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


class _Window:
    """A blocking `fetch(offset, length)` that reads up to WINDOW bytes ahead (never past
    `end`) in one request, so a file of many small chunks costs few requests, not one each."""

    WINDOW = 8 << 20

    def __init__(self, f: Any, end: int) -> None:
        self.f, self.end, self.start, self.buf = f, end, 0, b""

    def fetch(self, offset: int, length: int) -> bytes:
        at = offset - self.start
        if at < 0 or at + length > len(self.buf):
            self.f.seek(offset)
            self.buf = self.f.read(max(length, min(self.WINDOW, self.end - offset)))
            self.start, at = offset, 0
        return self.buf[at:at + length]


class _FileSource(iobase.BoundedSource):
    """The records of one ArrayRecord file; positions are record indices."""

    def __init__(self, url: str, size: int, verify: str = "headers",
                 storage_options: dict | None = None) -> None:
        self.url, self.size, self.verify = url, size, verify
        self.storage_options = storage_options
        self._index: FileIndex | None = None

    def __getstate__(self) -> dict:  # the index is re-read where needed, not shipped
        return {**self.__dict__, "_index": None}

    def _reader(self, fetch: Any) -> RangeReader:
        reader = RangeReader(fetch, self.size, path=redact(self.url), verify=self.verify,
                             index=self._index)
        self._index = reader.index
        return reader

    def _file(self) -> Any:  # our reads are ranged and planned: no fsspec read-ahead
        fs, path = _fs(self.url, self.storage_options)
        return fs.open(path, "rb", cache_type="none")

    def index(self) -> FileIndex:
        if self._index is None:
            with self._file() as f:
                self._reader(_Window(f, self.size).fetch)
        return self._index  # type: ignore[return-value]

    def estimate_size(self) -> int:
        return self.size

    def split(self, desired_bundle_size: int, start_position: int | None = None,
              stop_position: int | None = None) -> Iterator[iobase.SourceBundle]:
        index = self.index()
        start = 0 if start_position is None else start_position
        stop = index.num_records if stop_position is None else stop_position
        if stop <= start:
            return
        per_record = max(1.0, self.size / max(1, index.num_records))
        want = max(1, int(desired_bundle_size / per_record))
        starts = index.record_starts
        cuts = [start]
        for s in starts[1:-1].tolist():  # chunk boundaries strictly inside (start, stop)
            if s - cuts[-1] >= want and start < s < stop:
                cuts.append(s)
        cuts.append(stop)
        for a, b in itertools.pairwise(cuts):
            yield iobase.SourceBundle(weight=(b - a) * per_record, source=self,
                                      start_position=a, stop_position=b)

    def get_range_tracker(self, start_position: int | None,
                          stop_position: int | None) -> OffsetRangeTracker:
        stop = self.index().num_records if stop_position is None else stop_position
        return OffsetRangeTracker(start_position or 0, stop)

    def read(self, range_tracker: OffsetRangeTracker) -> Iterator[bytes]:
        with self._file() as f:
            window = _Window(f, self.size)
            reader = self._reader(window.fetch)
            index = reader.index
            pos = range_tracker.start_position()
            if pos >= index.num_records:
                return
            chunk = int(index.locate([pos])[0][0])
            last = int(index.locate([min(range_tracker.stop_position(), index.num_records) - 1]
                                    )[0][0])
            window.end = int(index.chunk_ends[last])  # read ahead only within this bundle
            starts = index.record_starts.tolist()
            while chunk < index.num_chunks and starts[chunk] < range_tracker.stop_position():
                records = reader.read_chunk(chunk)
                for j in range(max(0, pos - starts[chunk]), len(records)):
                    if not range_tracker.try_claim(starts[chunk] + j):
                        return
                    yield records.record(j)
                chunk += 1

    def default_output_coder(self) -> beam.coders.Coder:
        return beam.coders.BytesCoder()


def match_files(patterns: str | Sequence[str],
                storage_options: dict | None = None) -> list[tuple[str, int]]:
    """`(url, size)` of every file the patterns name, sorted within each pattern."""
    out = []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        fs, path = _fs(pattern, storage_options)
        protocol = pattern.split("://", 1)[0] + "://" if "://" in pattern else ""
        if has_glob(pattern):
            found = fs.glob(path, detail=True)
            if not found:
                raise FileNotFoundError(f"{redact(pattern)}: no file matches")
            named = sorted((fs.unstrip_protocol(p) if protocol else p, int(info["size"]))
                           for p, info in found.items() if info.get("type") != "directory")
            out.extend(named)
        else:
            out.append((pattern, int(fs.info(path)["size"])))
    return out


class ReadFromArrayRecord(beam.PTransform):
    """Read the records (`bytes`) of every ArrayRecord file matching `pattern` (a path, an
    fsspec URL or glob, or a list of them). Files are listed when the pipeline is built."""

    def __init__(self, pattern: str | Sequence[str], verify: str = "headers",
                 storage_options: dict | None = None) -> None:
        super().__init__()
        self.pattern, self.verify, self.storage_options = pattern, verify, storage_options

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        sources = [_FileSource(url, size, self.verify, self.storage_options)
                   for url, size in match_files(self.pattern, self.storage_options)]
        return pbegin | "Read" >> beam.io.Read(ConcatSource(sources))
