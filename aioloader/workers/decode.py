"""Turning a task's chunk refs (and, for remote files, the fetched chunk bytes) into records, in
the process that runs the task: a worker, or the inline pool of `workers=0`.

Every group size goes this one way. With group size 1 (the layout of shuffled training data)
every record is its own chunk, and `decode_records` decodes a task's records in one call. With
larger groups many records of a task share a chunk: each distinct chunk is read (local files)
or shipped (remote bytes, deduplicated by the pool) once and decoded once per task, and kept,
decoded, in a byte-bounded LRU (`ChunkCache`) for the next tasks, which with a block shuffle
or a sequential read ask for the same chunks again. One-record chunks are not cached:
`decode_records` decodes them inline in a few microseconds.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..arrayrecord import ArrayRecordFormatError, ChunkRecords
from ..arrayrecord.chunk import DEFAULT_MAX_DECODED
from ..arrayrecord.errors import CORRUPT_HINT
from ..arrayrecord.index import decode_chunk, decode_records
from ..planning import ChunkRefs
from .localfiles import LocalFiles

# The parent used to keep this much of decoded chunks (ArrayRecordSource's cache): the pool
# shares it out among its workers (`Pool`), so the loader holds no more than before.
DEFAULT_CHUNK_CACHE_BYTES = 256 << 20


class ChunkCache:
    """Decoded multi-record chunks by (file name, chunk start), least recently used out
    first, bounded in bytes (their values and bounds)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple[str, int], tuple[ChunkRecords, int]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> ChunkRecords | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: tuple[str, int], records: ChunkRecords) -> None:
        values = records.values
        if not isinstance(values.obj, bytes):  # a view of the arena or a map: reused later
            records = ChunkRecords(memoryview(bytes(values)), records.bounds)
        size = len(records.values) + records.bounds.nbytes
        if size > self.max_bytes or key in self._items:
            return
        self._items[key] = (records, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old

    def __len__(self) -> int:
        return len(self._items)


def chunk_keys(refs: ChunkRefs) -> list[tuple[int, int]] | None:
    """Each record's chunk as (file, start), for spotting records that share one; None when
    every chunk holds one record (group size 1: records share chunks only by repeating)."""
    if refs.count is None or not len(refs) or int(refs.count.max()) <= 1:
        return None
    return list(zip(refs.file.tolist(), refs.start.tolist()))


def _pick(refs: ChunkRefs, idx: np.ndarray) -> ChunkRefs:
    """The refs of records `idx` (same files and names)."""
    return dataclasses.replace(
        refs, file=refs.file[idx], chunk=refs.chunk[idx], start=refs.start[idx],
        end=refs.end[idx], within=refs.within[idx],
        count=refs.count[idx] if refs.count is not None else None)


class Decoder:
    """What one decoding process keeps across tasks: its local file descriptors (`files`) and
    its cache of decoded multi-record chunks; and per task, `decoded` and `hits` (chunks
    decoded, chunks found in the cache)."""

    def __init__(self, cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES) -> None:
        self.files = LocalFiles()
        self.cache = ChunkCache(cache_bytes)
        self.decoded = 0
        self.hits = 0

    def records(self, refs: ChunkRefs, raws: Sequence | None, *, verify: str = "headers",
                max_decoded: int = DEFAULT_MAX_DECODED,
                paths: Sequence[str] | None = None) -> list[bytes]:
        """Record `refs.within[i]` of the chunk `refs` places record i in, for every i.

        `raws[i]` is that chunk's physical bytes (records of one chunk may share them), or
        None: the files are local (or the memory copy of a remote dataset) and are read
        here. `paths` names each record's file in errors (group size 1; otherwise the
        names come from `refs`).
        """
        self.decoded = self.hits = 0
        keys = chunk_keys(refs)
        if keys is None:  # group size 1: one call decodes them all
            if raws is None:
                raws = self.files.read(refs)
            return decode_records(raws, refs.start.tolist(), refs.within.tolist(),
                                  verify=verify, paths=paths, chunks=refs.chunk.tolist(),
                                  counts=None if refs.count is None else refs.count.tolist(),
                                  max_decoded=max_decoded)
        return self._shared(refs, raws, keys, verify, max_decoded)

    def _shared(self, refs: ChunkRefs, raws: Sequence | None, keys: list[tuple[int, int]],
                verify: str, max_decoded: int) -> list[bytes]:
        """Records of chunks that hold several: each distinct chunk read and decoded once."""
        number: dict[tuple[int, int], int] = {}
        first: list[int] = []  # a record of each distinct chunk
        inverse = []  # each record's distinct chunk
        for i, key in enumerate(keys):
            j = number.get(key)
            if j is None:
                j = number[key] = len(first)
                first.append(i)
            inverse.append(j)
        counts = refs.count.tolist()  # type: ignore[union-attr]
        names = [refs.name(f) for f in range(len(refs.paths))]
        file, start = refs.file.tolist(), refs.start.tolist()
        chunks: list[Any] = [None] * len(first)
        missing = []
        for j, i in enumerate(first):
            hit = self.cache.get((names[file[i]], start[i])) if counts[i] > 1 else None
            if hit is None:
                missing.append(i)
            else:
                chunks[j] = hit
                self.hits += 1
        if missing:
            got = (self.files.read(_pick(refs, np.asarray(missing, dtype=np.int64)))
                   if raws is None else [raws[i] for i in missing])
            for i, raw in zip(missing, got):
                name = names[file[i]]
                _, records = decode_chunk(raw, start[i], verify=verify, path=name,
                                          chunk=int(refs.chunk[i]),
                                          expected_records=counts[i], max_decoded=max_decoded,
                                          whole_range=True)
                chunks[inverse[i]] = records
                self.decoded += 1
                if counts[i] > 1:
                    self.cache.put((name, start[i]), records)
        out = []
        for i, (j, w) in enumerate(zip(inverse, refs.within.tolist())):
            records = chunks[j]
            if not 0 <= w < len(records):
                raise ArrayRecordFormatError(
                    f"record {w} asked of a chunk of {len(records)} records",
                    path=names[file[i]], offset=start[i], chunk=int(refs.chunk[i]),
                    hint=CORRUPT_HINT)
            out.append(records.record(w))
        return out

    def close(self) -> None:
        self.files.close()
