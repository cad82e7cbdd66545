"""`ReadFromArrayRecord`: a Beam source that splits ArrayRecord files by record ranges.

A `BoundedSource` per file whose positions are record indices: initial splits cut at chunk
boundaries (no chunk is decoded by two bundles), and the `OffsetRangeTracker` claims record by
record, so runners may split dynamically (Dataflow's work rebalancing) at any record. Files
are listed when the pipeline is built; each bundle re-reads its file's footer (the index is
not shipped with the source, it can be megabytes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io import iobase
from apache_beam.io.concat_source import ConcatSource
from apache_beam.io.range_trackers import OffsetRangeTracker

from ..arrayrecord import DEFAULT_VERIFY, FileIndex, RangeReader
from ..tools.convert import glob_matches
from ..urls import redact
from .sink import url_fs

__all__ = ["ReadFromArrayRecord", "match_files"]


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

    def __init__(self, url: str, size: int, verify: str = DEFAULT_VERIFY,
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
        fs, path = url_fs(self.url, self.storage_options)
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
            stop = min(range_tracker.stop_position(), index.num_records)
            if pos >= stop:
                return
            chunk = int(index.locate([pos])[0][0])
            last = int(index.locate([stop - 1])[0][0])
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
    """`(url, size)` of every file the patterns name, sorted within each pattern (globs are
    expanded by `aioloader.tools.convert.glob_matches`, as `convert` does on one machine)."""
    out = []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        matched = glob_matches(pattern, storage_options)
        if matched is None:
            fs, path = url_fs(pattern, storage_options)
            matched = [(pattern, int(fs.info(path)["size"]))]
        out.extend(matched)
    return out


class ReadFromArrayRecord(beam.PTransform):
    """Read the records (`bytes`) of every ArrayRecord file matching `pattern` (a path, an
    fsspec URL or glob, or a list of them). Files are listed when the pipeline is built."""

    def __init__(self, pattern: str | Sequence[str], verify: str = DEFAULT_VERIFY,
                 storage_options: dict | None = None) -> None:
        super().__init__()
        self.pattern, self.verify, self.storage_options = pattern, verify, storage_options

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        sources = [_FileSource(url, size, self.verify, self.storage_options)
                   for url, size in match_files(self.pattern, self.storage_options)]
        return pbegin | "Read" >> beam.io.Read(ConcatSource(sources))
