"""Locating records: the opened files, their footer indices, and one table of every chunk.

Opening lists the files (one listing for a glob), then reads every file's tail — postscript
and footer together in one speculative range read — all files in parallel (local files in a
few batched thread-pool jobs, by small reads of what they declare: the postscript's head,
then the footer; remote tails as many in flight as the storage allows); a gs:// file
named without a glob takes one request (a suffix-range GET also gives its size and
generation). With an index cache, the listing is followed by one mapped table instead
(`index_cache`). Each file is pinned to the version first seen, so a rewrite shows up as an
error, not as other records.

The result, a `RecordTable`, is what the rest of the source asks "where is record i?": file
numbers (a file's place in `urls`) are the ids every later stage uses; URLs are only for
reading and for errors. It fetches nothing after opening.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Generator, Sequence
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
    """List and index the files `patterns` name, in order, all at once. With an index
    cache: list, then map the files' cached table, or index them and store it."""
    opener = _Opener(storage, verify)
    if index_cache is not None:
        listed = await gather_all(opener.list_pattern(p) for p in patterns)
        infos = [i for group in listed for i in group]
        cached = index_cache.load(infos)
        if cached is not None:
            table = RecordTable(infos, cached.indices, cached.bounds)
            table.pattern_files = [len(g) for g in listed]
            return table
        table = RecordTable(infos, await opener.open_files(infos))
        table.pattern_files = [len(g) for g in listed]
        index_cache.store(infos, table.indices)
        return await _trimmed(table)
    groups = await gather_all(opener.open_pattern(p) for p in patterns)
    table = RecordTable([info for group in groups for info, _ in group],
                        [index for group in groups for _, index in group])
    table.pattern_files = [len(g) for g in groups]
    del groups  # the parsed columns, now copied into the table: free them before trimming
    return await _trimmed(table)


async def _trimmed(table: RecordTable) -> RecordTable:
    """`table`, after giving the heap's free memory back to the system (glibc only).

    Parsing footers frees per-file columns (copied into the table, narrowed, or found to
    be all ones) of ~100 KB–40 MB each; glibc's growing mmap threshold keeps such blocks in
    the heap, which left ~8 bytes per record of freed memory in RSS after a 5M-record open.
    """
    if _malloc_trim is not None and table.chunk_count > 100_000:
        await asyncio.sleep(0)  # finished tasks' callbacks still hold their results
        _malloc_trim(0)
    return table


def _find_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, ImportError):  # not glibc: nothing to do
        return None


_malloc_trim = _find_malloc_trim() if sys.platform.startswith("linux") else None


class _Opener:
    """Reads files' tails into footer indices through one storage."""

    def __init__(self, storage: Storage, verify: str) -> None:
        self.storage = storage
        self.verify = verify

    async def list_pattern(self, pattern: str) -> list[ObjectInfo]:
        """The files `pattern` names, pinned: a listing for a glob, a lookup for a name."""
        if has_glob(pattern):
            return await self._list(pattern)
        info = await self.storage.info(pattern)
        self.storage.pin(info)
        return [info]

    async def open_pattern(self, pattern: str) -> list[tuple[ObjectInfo, FileIndex]]:
        """Open the files `pattern` names, in order, each pinned to the version first seen.

        A glob is one listing (sizes and generations included), then one tail read per file.
        A single name is one request on gs:// (a suffix-range GET gives size, generation and
        tail together), and a size lookup then a tail read elsewhere; its tail is parsed as
        soon as it arrives, so thousands of named files never hold their tails all at once.
        """
        if has_glob(pattern):
            files = await self._list(pattern)
            return list(zip(files, await self.open_files(files)))
        info, tail = await self.storage.read_tail(pattern, self._tail_bytes(pattern))
        self.storage.pin(info)
        return [(info, await self._open_file(info, tail))]

    async def open_files(self, files: list[ObjectInfo]) -> list[FileIndex]:
        """Index many files at once. Remote files: as many tail reads in flight as the
        storage allows, each parsed as it lands (`_open_remote`). Local files: every
        parser's next read goes out in one `read_many` (a few batched thread-pool jobs, not
        a hop per file), in waves that fit the byte budget."""
        local = [k for k, info in enumerate(files) if is_local(info.url)]
        out: list[FileIndex | None] = [None] * len(files)
        if len(local) < len(files):
            remote = [k for k in range(len(files)) if not is_local(files[k].url)]
            for k, index in zip(remote, await self._open_remote([files[k] for k in remote])):
                out[k] = index
        steps: dict[int, Generator[tuple[int, int], bytes | memoryview, FileIndex]] = {}
        wanted: dict[int, tuple[int, int]] = {}
        for k in local:
            info = files[k]
            steps[k] = open_index(info.size, path=redact(info.url), verify=self.verify,
                                  tail=self._tail_bytes(info.url),
                                  max_decoded=self.storage.max_inflight_bytes,
                                  small_reads=True)
            wanted[k] = next(steps[k])
        wave_bytes = max(1, self.storage.max_inflight_bytes // 2)
        while wanted:
            keys: list[int] = []
            total = 0
            for k, (_, length) in wanted.items():
                if keys and total + length > wave_bytes:
                    break
                keys.append(k)
                total += length
            datas = await self.storage.read_many(
                [(files[k].url, wanted[k][0], wanted[k][0] + wanted[k][1]) for k in keys])
            for k, data in zip(keys, datas):
                try:
                    wanted[k] = steps[k].send(data)
                except StopIteration as done:
                    del wanted[k]
                    out[k] = done.value
        return out  # type: ignore[return-value]

    async def _open_remote(self, files: list[ObjectInfo]) -> list[FileIndex]:
        """Index remote files, at most `storage.limit` at once: that many tasks take the next
        file as each finishes. Handing the storage every tail at once would queue the rest
        on its slots, and a read's deadline runs from when it is issued: opening thousands
        of files from a slow bucket failed so, each read timed out waiting behind the others.
        """
        out: list[FileIndex | None] = [None] * len(files)
        todo = iter(range(len(files)))

        async def opener() -> None:
            for k in todo:  # shared: each file is taken by one task
                out[k] = await self._open_file(files[k])

        await gather_all(opener() for _ in range(min(len(files), max(1, self.storage.limit))))
        return out  # type: ignore[return-value]

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
            return done.value


class _Chunks:
    """Every chunk of every file in one table, so a batch is located with one search.

    Lean for millions of chunks (the whole table is about 12 bytes per group_size-1 record):
    `bounds` holds each file's chunk offsets followed by its footer offset, so chunk g of
    file f starts at `bounds[g + f]` and ends at `bounds[g + f + 1]` (a chunk's range runs
    to the next chunk or the footer, as `FileIndex.chunk_ends` says), and the files' own
    `chunk_offsets` / `chunk_ends` are rebound as views of it; a chunk's file is a search
    over `first_chunk`; when every chunk holds one record (group_size 1), chunk g is record
    g and no record table is kept.
    """

    def __init__(self, indices: Sequence[FileIndex], starts: np.ndarray,
                 bounds: np.ndarray | None = None) -> None:
        counts = np.array([ix.num_chunks for ix in indices], dtype=np.int64)
        self.first_chunk = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_chunks = int(self.first_chunk[-1])
        self.shared = bounds is not None  # the indices are views of it already (mapped)
        if bounds is None:
            bounds = np.empty(self.num_chunks + len(indices), dtype=np.int64)
            for f, ix in enumerate(indices):
                lo = int(self.first_chunk[f]) + f
                bounds[lo : lo + ix.num_chunks] = ix.chunk_offsets
                bounds[lo + ix.num_chunks] = ix.footer_offset
        elif len(bounds) != self.num_chunks + len(indices):
            raise ValueError("bounds do not hold the files' chunks")
        self.bounds = bounds
        self.one_record_chunks = all(ix.one_record_chunks for ix in indices)
        # Global index of each chunk's first record, plus the total (None: chunk g is record g).
        self.record_starts: np.ndarray | None = None
        if not self.one_record_chunks:
            rs = np.empty(self.num_chunks + 1, dtype=np.int64)
            rs[0] = 0
            for f, ix in enumerate(indices):
                lo = int(self.first_chunk[f])
                np.cumsum(ix.chunk_records, out=rs[lo + 1 : lo + 1 + ix.num_chunks])
                rs[lo + 1 : lo + 1 + ix.num_chunks] += starts[f]
            self.record_starts = rs

    def rebind(self, indices: Sequence[FileIndex]) -> list[FileIndex]:
        """The files' indices with their chunk offsets and ends as views of `bounds`."""
        if self.shared:
            return list(indices)
        out = []
        for f, ix in enumerate(indices):
            lo = int(self.first_chunk[f]) + f
            out.append(ix.with_bounds(self.bounds[lo : lo + ix.num_chunks + 1], check=False))
        return out

    def record_start(self, g: np.ndarray) -> np.ndarray:
        """Global index of the first record of chunks `g` (g may be num_chunks: the total)."""
        return g if self.record_starts is None else self.record_starts[g]

    def file_of(self, g: np.ndarray) -> np.ndarray:
        """The file each of the global chunks `g` lies in."""
        return np.searchsorted(self.first_chunk, g, side="right") - 1

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file, start, end) of every chunk as arrays (built on demand: 24 bytes a chunk)."""
        sizes = np.diff(self.first_chunk)
        file = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        g = np.arange(self.num_chunks, dtype=np.int64) + file
        return file, self.bounds[g], self.bounds[g + 1]


class RecordTable:
    """The opened files (numbered in order) and where each global record lies in them."""

    def __init__(self, files: list[ObjectInfo], indices: list[FileIndex],
                 bounds: np.ndarray | None = None) -> None:
        """`bounds`, when given, is the table of chunk boundaries the indices are already
        views of (an index cache's mapped entry: see `_Chunks`)."""
        self.files = files
        counts = np.array([ix.num_records for ix in indices], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.urls = [f.url for f in files]
        self._chunks = _Chunks(indices, self.starts, bounds)
        self.indices = self._chunks.rebind(indices)
        # Files with chunks of more than one record (counted, not the writer's group_size,
        # as `max_group_size` is): a chunk may be needed again for another of its records,
        # so the fetch stage caches their raw chunks, and `read` their decoded records.
        self.grouped = np.array([ix.max_records > 1 for ix in self.indices], dtype=bool)
        self._runs: dict[int, Runs] = {}
        self.pattern_files: list[int] | None = None  # files each opened pattern named

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def pattern_records(self) -> tuple[int, ...]:
        """Records of each pattern the table was opened with, in order (a mix's inputs are
        runs of patterns); the files' counts when the patterns are not known."""
        files = self.pattern_files or [1] * len(self.files)
        ends = self.starts[np.cumsum([0, *files])]
        return tuple(int(x) for x in np.diff(ends))

    @property
    def chunk_count(self) -> int:
        """Chunks in all files."""
        return self._chunks.num_chunks

    @property
    def chunk_starts(self) -> np.ndarray:
        """Global index of the first record of every chunk of every file, plus the total
        (for group_size 1 files, built on each call: it is `arange`)."""
        t = self._chunks
        if t.record_starts is None:
            return np.arange(t.num_chunks + 1, dtype=np.int64)
        return t.record_starts

    def runs(self, target: int) -> Runs:
        """Every file cut into runs of whole chunks of about `target` bytes (see
        `planning.cut_runs`): the blocks of the block shuffle and the segments of the cache
        tiers. Computed once per target."""
        runs = self._runs.get(target)
        if runs is None:
            runs = self._runs[target] = cut_runs(*self._chunks.columns(), target)
        return runs

    def run_record_starts(self, target: int) -> np.ndarray:
        """Global index of the first record of each run, plus the total (prefix sums)."""
        return self._chunks.record_start(self.runs(target).chunk)

    def blocks(self, target: int) -> tuple[np.ndarray, np.ndarray]:
        """The block shuffle's blocks (runs of about `target` bytes on disk): their record
        starts, and their decoded bytes (what a window holds in memory)."""
        decoded = np.concatenate([ix.chunk_decoded_sizes for ix in self.indices]
                                 or [np.zeros(0, np.int64)]).astype(np.int64)
        first = self.runs(target).chunk[:-1]
        sizes = np.add.reduceat(decoded, first) if first.size else np.zeros(0, np.int64)
        return self.run_record_starts(target), sizes

    @property
    def max_group_size(self) -> int:
        """The most records any chunk holds (1: every record is its own chunk)."""
        return max(max(ix.max_records, 1) for ix in self.indices) if self.indices else 1

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
        rs = self._chunks.record_starts
        if rs is None:  # group_size 1 everywhere: chunk g holds record g
            return idx, np.zeros_like(idx)
        g = np.searchsorted(rs, idx, side="right") - 1
        return g, idx - rs[g]

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global record indices → (file, chunk, index within chunk), vectorized."""
        g, within = self._chunks_of(indices)
        t = self._chunks
        files = t.file_of(g)
        return files, g - t.first_chunk[files], within

    def chunk_refs(self, indices) -> ChunkRefs:
        """Where each record's chunk lies: what a worker needs to read and decode it, and
        the file numbers the fetch stage reads it by."""
        g, within = self._chunks_of(indices)
        t = self._chunks
        files = t.file_of(g)
        used, local_file = np.unique(files, return_inverse=True)
        u = used.tolist()
        at = g + files
        count = (np.ones_like(g) if t.record_starts is None else
                 t.record_starts[g + 1] - t.record_starts[g])
        return ChunkRefs(paths=[self.urls[f] for f in u], file=local_file.astype(np.int64),
                         chunk=g - t.first_chunk[files], start=t.bounds[at],
                         end=t.bounds[at + 1], within=within, count=count,
                         names=[self.indices[f].path for f in u], ids=used.astype(np.int64))
