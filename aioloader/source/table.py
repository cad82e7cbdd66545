"""Locating records: the opened files, their footer indices, and one table of every chunk.

Opening lists the files (one listing for a glob), then reads every file's tail — postscript
and footer together in one speculative range read — all files in parallel; a gs:// file named
without a glob takes one request (a suffix-range GET also gives its size and generation).
Each file is pinned to the version first seen, so a rewrite shows up as an error, not as
other records.

The result, a `RecordTable`, is what the rest of the source asks "where is record i?": file
numbers (a file's place in `urls`) are the ids every later stage uses; URLs are only for
reading and for errors. It fetches nothing after opening.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..arrayrecord import FileIndex, open_index
from ..index_cache import IndexCache
from ..planning import ChunkRefs, Runs, cut_runs
from ..storage import ObjectInfo, Storage, has_glob, is_local, redact

LOCAL_TAIL = 1 << 18
CLOUD_TAIL = 1 << 20  # one round trip opens files of up to ~300k chunks


async def gather_all(coros) -> list[Any]:
    """`asyncio.gather`, but the first failure cancels and awaits the rest, so none is still
    running (and using the storage being closed) when the error reaches the caller."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def open_table(patterns: Sequence[str], storage: Storage, *, verify: str,
                     index_cache: IndexCache | None) -> RecordTable:
    """List and index the files `patterns` name, in order, all at once."""
    opener = _Opener(storage, verify, index_cache)
    groups = await gather_all(opener.open_pattern(p) for p in patterns)
    return RecordTable([info for group in groups for info, _ in group],
                       [index for group in groups for _, index in group])


class _Opener:
    """Reads files' tails into footer indices through one storage."""

    def __init__(self, storage: Storage, verify: str, index_cache: IndexCache | None) -> None:
        self.storage = storage
        self.verify = verify
        self.index_cache = index_cache

    async def open_pattern(self, pattern: str) -> list[tuple[ObjectInfo, FileIndex]]:
        """Open the files `pattern` names, in order, each pinned to the version first seen.

        A glob is one listing (sizes and generations included), then one tail read per file.
        A single name is one request on gs:// (a suffix-range GET gives size, generation and
        tail together), and a size lookup then a tail read elsewhere; its tail is parsed as
        soon as it arrives, so thousands of named files never hold their tails all at once.
        """
        if has_glob(pattern):
            files = await self._list(pattern)
            return list(zip(files, await gather_all(self._open_file(f) for f in files)))
        info, tail = await self.storage.read_tail(pattern, self._tail_bytes(pattern))
        self.storage.pin(info)
        return [(info, await self._open_file(info, tail))]

    def _tail_bytes(self, url: str) -> int:
        """How much of a file's end to read speculatively at open (within the byte budget)."""
        return min(LOCAL_TAIL if is_local(url) else CLOUD_TAIL, self.storage.max_inflight_bytes)

    async def _list(self, pattern: str) -> list[ObjectInfo]:
        """The files a glob matches, pinned; no per-file lookups (the listing has it all)."""
        found = await self.storage.glob(pattern)
        if not found:
            raise FileNotFoundError(
                f"no files match {redact(pattern)!r} (check the path and pattern)"
            )
        for info in found:
            self.storage.pin(info)
        return found

    async def _open_file(self, info: ObjectInfo, tail: bytes | None = None) -> FileIndex:
        """Index one file; `tail`, when given, is its last `len(tail)` bytes, already read."""
        cached = self.index_cache.load(info) if self.index_cache else None
        if cached is not None:
            return cached
        steps = open_index(info.size, path=redact(info.url), verify=self.verify,
                           tail=self._tail_bytes(info.url),
                           max_decoded=self.storage.max_inflight_bytes)
        tail_at = info.size - len(tail) if tail is not None else info.size
        try:
            offset, length = next(steps)
            while True:
                if tail is not None and tail_at <= offset and offset + length <= info.size:
                    data = (tail if length == len(tail) else
                            memoryview(tail)[offset - tail_at : offset - tail_at + length])
                else:
                    data = await self.storage.read(info.url, offset, offset + length)
                offset, length = steps.send(data)
        except StopIteration as done:
            index = done.value
        if self.index_cache is not None:
            self.index_cache.store(info, index)
        return index


@dataclass(frozen=True)
class _Chunks:
    """Every chunk of every file in one table, so a batch is located with one search.

    Global chunk g is chunk `g - first_chunk[file[g]]` of file `file[g]`; a per-record cost
    independent of the number of files and chunks (unlike a per-file loop).
    """

    record_starts: np.ndarray  # global index of each chunk's first record, plus the total
    file: np.ndarray
    first_chunk: np.ndarray
    offsets: np.ndarray
    ends: np.ndarray
    one_record_chunks: bool  # every chunk holds one record (group_size 1): no search needed

    @classmethod
    def build(cls, indices: Sequence[FileIndex], starts: np.ndarray) -> _Chunks:
        counts = [ix.num_chunks for ix in indices]
        first = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        if not indices:
            empty = np.zeros(0, dtype=np.int64)
            return cls(np.zeros(1, np.int64), empty, first, empty, empty, True)
        rec = [ix.record_starts[:-1] + s for ix, s in zip(indices, starts[:-1].tolist())]
        record_starts = np.concatenate([*rec, starts[-1:]]).astype(np.int64)
        return cls(
            record_starts=record_starts,
            file=np.repeat(np.arange(len(indices), dtype=np.int64), counts),
            first_chunk=first,
            offsets=np.concatenate([ix.chunk_offsets for ix in indices]).astype(np.int64),
            ends=np.concatenate([ix.chunk_ends for ix in indices]).astype(np.int64),
            one_record_chunks=bool((np.diff(record_starts) == 1).all()),
        )


class RecordTable:
    """The opened files (numbered in order) and where each global record lies in them."""

    def __init__(self, files: list[ObjectInfo], indices: list[FileIndex]) -> None:
        self.files = files
        self.indices = indices
        counts = np.array([ix.num_records for ix in indices], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.urls = [f.url for f in files]
        # Files with chunks of more than one record (counted, not the writer's group_size,
        # as `max_group_size` is): a chunk may be needed again for another of its records,
        # so the fetch stage caches their raw chunks, and `read` their decoded records.
        self.grouped = np.array([ix.num_chunks > 0 and int(ix.chunk_records.max()) > 1
                                 for ix in indices], dtype=bool)
        self._runs: dict[int, Runs] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    @cached_property
    def _chunks(self) -> _Chunks:
        return _Chunks.build(self.indices, self.starts)

    @property
    def chunk_starts(self) -> np.ndarray:
        """Global index of the first record of every chunk of every file, plus the total."""
        return self._chunks.record_starts

    def runs(self, target: int) -> Runs:
        """Every file cut into runs of whole chunks of about `target` bytes (see
        `planning.cut_runs`): the blocks of the block shuffle and the segments of the cache
        tiers. Computed once per target."""
        runs = self._runs.get(target)
        if runs is None:
            t = self._chunks
            runs = self._runs[target] = cut_runs(t.file, t.offsets, t.ends, target)
        return runs

    def run_record_starts(self, target: int) -> np.ndarray:
        """Global index of the first record of each run, plus the total (prefix sums)."""
        return self._chunks.record_starts[self.runs(target).chunk]

    @property
    def max_group_size(self) -> int:
        """The most records any chunk holds (1: every record is its own chunk)."""
        return max((int(ix.chunk_records.max()) if ix.num_chunks else 1)
                   for ix in self.indices) if self.indices else 1

    @property
    def all_local(self) -> bool:
        return all(is_local(u) for u in self.urls)

    def _chunks_of(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Global record indices → (global chunk, index within chunk), vectorized."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"record {bad} out of range: the source has {n} records")
        t = self._chunks
        if t.one_record_chunks:  # group_size 1 everywhere: chunk g holds record g
            return idx, np.zeros_like(idx)
        g = np.searchsorted(t.record_starts, idx, side="right") - 1
        return g, idx - t.record_starts[g]

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global record indices → (file, chunk, index within chunk), vectorized."""
        g, within = self._chunks_of(indices)
        t = self._chunks
        files = t.file[g]
        return files, g - t.first_chunk[files], within

    def chunk_refs(self, indices) -> ChunkRefs:
        """Where each record's chunk lies: what a worker needs to read and decode it, and
        the file numbers the fetch stage reads it by."""
        g, within = self._chunks_of(indices)
        t = self._chunks
        files = t.file[g]
        used, local_file = np.unique(files, return_inverse=True)
        u = used.tolist()
        return ChunkRefs(paths=[self.urls[f] for f in u], file=local_file.astype(np.int64),
                         chunk=g - t.first_chunk[files], start=t.offsets[g], end=t.ends[g],
                         within=within, count=t.record_starts[g + 1] - t.record_starts[g],
                         names=[self.indices[f].path for f in u], ids=used.astype(np.int64))
