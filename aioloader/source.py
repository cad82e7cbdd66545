"""`ArrayRecordSource`: a set of ArrayRecord files as one indexed record space.

Opening lists the files (one listing for a glob), then reads every file's tail — postscript
and footer together in one speculative range read — all files in parallel; a gs:// file named
without a glob takes one request (a suffix-range GET also gives its size and generation).
Reading a batch maps global indices to (file, chunk), plans merged byte ranges, fetches them
concurrently through one `Storage`, and decodes each needed chunk once. Decoded chunks of files
with group size > 1 stay in a byte-bounded LRU cache, so records of one chunk decode once. A
small remote dataset may instead be kept in memory whole (`resident`).

The sync API (`len`, `src[i]`) runs the same coroutines on the shared background loop, so
it works in scripts and in notebooks that run their own loop.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrayrecord import ArrayRecordFormatError, ChunkRecords, FileIndex, open_index
from .arrayrecord.index import decode_chunk
from .index_cache import IndexCache
from .planning import (
    CLOUD_MAX_GAP,
    DEFAULT_MAX_MERGED,
    LOCAL_MAX_GAP,
    ChunkRefs,
    plan_reads,
)
from .resident import SEGMENT_BYTES, ResidentFiles
from .storage import (
    ObjectChangedError,
    ObjectInfo,
    Storage,
    StorageError,
    StoreUnavailableError,
    has_glob,
    is_local,
    redact,
)
from .sync import release, run_sync

LOCAL_TAIL = 1 << 18
CLOUD_TAIL = 1 << 20  # one round trip opens files of up to ~300k chunks
_DECODE_IN_THREAD_BYTES = 1 << 20


async def _gather_all(coros) -> list[Any]:
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


class ChunkCache:
    """Decoded chunks, least recently used out first, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[tuple[int, int], ChunkRecords] = OrderedDict()

    def get(self, key: tuple[int, int]) -> ChunkRecords | None:
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return item

    def put(self, key: tuple[int, int], records: ChunkRecords) -> None:
        size = len(records.values)
        if size > self.max_bytes or key in self._items:
            return
        self._items[key] = records
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= len(old.values)


@dataclass(frozen=True)
class _ChunkTable:
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
    def build(cls, indices: Sequence[FileIndex], starts: np.ndarray) -> _ChunkTable:
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


class ArrayRecordSource:
    """Random access to the records of one or more ArrayRecord files.

    `paths` is a path or URL, a glob (`gs://bucket/train-*.array_record`), or a list of them;
    records are numbered across files in that order (globs sorted). With `resident_bytes`
    (off by default here; the loader's default is 1 GiB) a remote dataset up to that size is
    fetched in segments and kept in memory after the first read (`aioloader.resident`).
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        storage_options: dict[str, Any] | None = None,
        verify: str = "headers",
        storage: Storage | None = None,
        cache_bytes: int = 256 << 20,
        max_gap: int | None = None,
        max_merged: int = DEFAULT_MAX_MERGED,
        index_cache_dir: str | os.PathLike | None = None,
        resident_bytes: int = 0,
    ) -> None:
        self._patterns = ([os.fspath(paths)] if isinstance(paths, (str, os.PathLike))
                          else [os.fspath(p) for p in paths])
        if not self._patterns:
            raise ValueError("ArrayRecordSource needs at least one path")
        self.verify = verify
        self._owns_storage = storage is None
        self.storage = storage or Storage(storage_options=storage_options)
        self.cache = ChunkCache(cache_bytes)
        local = all(is_local(p) for p in self._patterns)
        self.max_gap = max_gap if max_gap is not None else (LOCAL_MAX_GAP if local
                                                             else CLOUD_MAX_GAP)
        # A merged read must fit the byte budget with room for others in flight.
        self.max_merged = max(1, min(max_merged, self.storage.max_inflight_bytes // 4))
        self.index_cache_dir = os.fspath(index_cache_dir) if index_cache_dir else None
        self._index_cache = IndexCache(index_cache_dir) if index_cache_dir else None
        self.resident_bytes = resident_bytes
        self.resident: ResidentFiles | None = None  # see aioloader.resident
        self._numbers: dict[str, int] | None = None
        self._files: list[ObjectInfo] | None = None
        self._indices: list[FileIndex] = []
        self._starts = np.zeros(1, dtype=np.int64)
        self._table: _ChunkTable | None = None
        self._open_lock: asyncio.Lock | None = None
        self._used_sync = False

    # -- opening ----------------------------------------------------------------------

    @classmethod
    async def open(cls, paths, **kw: Any) -> ArrayRecordSource:
        """Create and open a source from async code."""
        src = cls(paths, **kw)
        try:
            await src.aopen()
        except BaseException:
            await src.aclose()
            raise
        return src

    async def aopen(self) -> None:
        """List and index every file (idempotent)."""
        if self._files is not None:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._files is None:
                groups = await _gather_all(self._open_pattern(p) for p in self._patterns)
                files = [info for group in groups for info, _ in group]
                indices = [index for group in groups for _, index in group]
                counts = np.array([ix.num_records for ix in indices], dtype=np.int64)
                self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
                self._indices = indices
                self._files = files
                self._keep_resident(files)

    def _keep_resident(self, files: list[ObjectInfo]) -> None:
        """Fetch a remote dataset that fits `resident_bytes` in segments, and keep it."""
        total = sum(f.size for f in files)
        if not files or any(is_local(f.url) for f in files) or not \
                0 < total <= self.resident_bytes:
            return
        segment = max(1, min(SEGMENT_BYTES, self.storage.max_inflight_bytes // 4))
        self.resident = ResidentFiles([f.url for f in files], [f.size for f in files],
                                      self.storage.read_into, segment)

    async def _open_pattern(self, pattern: str) -> list[tuple[ObjectInfo, FileIndex]]:
        """Open the files `pattern` names, in order, each pinned to the version first seen.

        A glob is one listing (sizes and generations included), then one tail read per file.
        A single name is one request on gs:// (a suffix-range GET gives size, generation and
        tail together), and a size lookup then a tail read elsewhere; its tail is parsed as
        soon as it arrives, so thousands of named files never hold their tails all at once.
        """
        if has_glob(pattern):
            files = await self._list(pattern)
            return list(zip(files, await _gather_all(self._open_file(f) for f in files)))
        info, tail = await self.storage.read_tail(
            pattern, self._tail_bytes(pattern))
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
        cached = self._index_cache.load(info) if self._index_cache else None
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
        if self._index_cache is not None:
            self._index_cache.store(info, index)
        return index

    # -- what is open -----------------------------------------------------------------

    def _require_open(self) -> None:
        if self._files is None:
            try:
                self._sync(self.aopen())
            except BaseException:
                self.close()
                raise

    @property
    def urls(self) -> list[str]:
        self._require_open()
        return [f.url for f in self._files]  # type: ignore[union-attr]

    @property
    def file_indices(self) -> list[FileIndex]:
        self._require_open()
        return self._indices

    @property
    def file_starts(self) -> np.ndarray:
        """Global index of each file's first record, plus the total."""
        self._require_open()
        return self._starts

    def __len__(self) -> int:
        self._require_open()
        return int(self._starts[-1])

    # -- reading ----------------------------------------------------------------------

    def _chunks_of(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Global record indices → (global chunk, index within chunk), vectorized."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"record {bad} out of range: the source has {n} records")
        if self._table is None:
            self._table = _ChunkTable.build(self._indices, self._starts)
        t = self._table
        if t.one_record_chunks:  # group_size 1 everywhere: chunk g holds record g
            return idx, np.zeros_like(idx)
        g = np.searchsorted(t.record_starts, idx, side="right") - 1
        return g, idx - t.record_starts[g]

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global record indices → (file, chunk, index within chunk), vectorized."""
        g, within = self._chunks_of(indices)
        t = self._table
        assert t is not None
        files = t.file[g]
        return files, g - t.first_chunk[files], within

    def chunk_refs(self, indices) -> ChunkRefs:
        """Where each record's chunk lies: what a worker needs to read and decode it."""
        g, within = self._chunks_of(indices)
        t = self._table
        assert t is not None
        files = t.file[g]
        sizes = t.ends[g] - t.offsets[g]
        if sizes.size and int(sizes.max()) > self.storage.max_inflight_bytes:
            k = int(sizes.argmax())  # the worker would read it: refuse it here, as Storage does
            self.storage.check_budget(self._files[int(files[k])].url,  # type: ignore[index]
                                      int(t.offsets[g[k]]), int(t.ends[g[k]]))
        used, local_file = np.unique(files, return_inverse=True)
        urls = [self._files[f].url for f in used.tolist()]  # type: ignore[index]
        return ChunkRefs(paths=urls, file=local_file.astype(np.int64),
                         chunk=g - t.first_chunk[files], start=t.offsets[g], end=t.ends[g],
                         within=within, count=t.record_starts[g + 1] - t.record_starts[g],
                         names=[self._indices[f].path for f in used.tolist()])

    @property
    def all_local(self) -> bool:
        """Every file is on a local disk (workers may then read records themselves)."""
        self._require_open()
        return all(is_local(f.url) for f in self._files)  # type: ignore[union-attr]

    async def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The records at `indices`, in that order."""
        await self.aopen()
        files, chunks, within = self.locate(indices)
        decoded = await self.read_chunks(files, chunks)
        return [decoded[(f, c)].record(j)
                for f, c, j in zip(files.tolist(), chunks.tolist(), within.tolist())]

    async def read_chunks(self, files, chunks) -> dict[tuple[int, int], ChunkRecords]:
        """Fetch and decode the distinct (file, chunk) pairs named; each read once."""
        await self.aopen()
        keys = sorted(set(zip(np.asarray(files).tolist(), np.asarray(chunks).tolist())))
        out: dict[tuple[int, int], ChunkRecords] = {}
        missing = []
        for key in keys:
            hit = self.cache.get(key) if self._cacheable(key[0]) else None
            if hit is None:
                missing.append(key)
            else:
                out[key] = hit
        if not missing:
            return out
        try:
            raw = await self.fetch_raw(missing)
            work = [(key, *raw[key]) for key in missing]
            if sum(len(w[1]) for w in work) > _DECODE_IN_THREAD_BYTES:
                decoded = await asyncio.to_thread(self._decode_all, work)
            else:
                decoded = self._decode_all(work)
        except (ArrayRecordFormatError, StorageError) as err:
            raise await self.explain(err, {f for f, _ in missing}) from None
        for key, records in zip(missing, decoded):
            if self._cacheable(key[0]):
                self.cache.put(key, records)
            out[key] = records
        return out

    async def fetch_raw(
        self, keys: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], tuple[memoryview, int]]:
        """The physical bytes of each (file, chunk), with its file offset; merged reads."""
        await self.aopen()
        keys = list(dict.fromkeys(keys))
        files = np.array([f for f, _ in keys], dtype=np.int64)
        ranges = [self._indices[f].chunk_range(c) for f, c in keys]
        views = await self.fetch_ranges(files, np.array([r[0] for r in ranges], np.int64),
                                        np.array([r[1] for r in ranges], np.int64))
        return {key: (view, start) for key, view, (start, _) in zip(keys, views, ranges)}

    async def resident_refs(self, refs: ChunkRefs) -> ChunkRefs | None:
        """`refs` read from the in-memory copies of the files, once their segments are in
        (worker processes read those themselves); None when the dataset is not kept in
        memory that way, or this is the first read (fetch it with `fetch_refs`)."""
        kept = self.resident
        if kept is None or kept.worker_path is None or kept.unclaimed:
            return None
        number = self._file_numbers()
        used = np.array([number[u] for u in refs.paths], dtype=np.int64)
        if not await kept.ensure(used[refs.file], refs.start, refs.end):
            return None  # another event loop
        return refs.read_from([kept.worker_path] * len(used), kept.base[used].tolist())

    def _file_numbers(self) -> dict[str, int]:
        """URL → file number (built once: it is asked for on every task)."""
        if self._numbers is None:
            self._numbers = {u: i for i, u in enumerate(self.urls)}
        return self._numbers

    async def fetch_refs(self, refs: ChunkRefs) -> list[memoryview]:
        """The physical bytes of each record's chunk in `refs` (merged reads)."""
        number = self._file_numbers()
        files = np.array([number[u] for u in refs.paths], dtype=np.int64)[refs.file]
        return await self.fetch_ranges(files, refs.start, refs.end)

    async def fetch_ranges(self, files: np.ndarray, starts: np.ndarray,
                           ends: np.ndarray) -> list[memoryview]:
        """Byte ranges of files (by number): from resident segments when the dataset is
        kept in memory, else through merged range reads."""
        if self.resident is not None:
            views = await self.resident.views(files, starts, ends)
            if views is not None:
                return views
            try:
                return await self._read_ranges(files, starts, ends)
            finally:  # the first read is done (or failed): segments may come now
                self.resident.start(files, starts, ends)
        return await self._read_ranges(files, starts, ends)

    async def _read_ranges(self, files: np.ndarray, starts: np.ndarray,
                           ends: np.ndarray) -> list[memoryview]:
        plan = plan_reads(files, starts, ends, max_gap=self.max_gap,
                          max_merged=self.max_merged)
        urls = [self._files[f].url for f in plan.read_file.tolist()]  # type: ignore[index]
        raws = await self.storage.read_many(
            list(zip(urls, plan.read_start.tolist(), plan.read_end.tolist()))
        )
        views = [memoryview(r) for r in raws]
        return [views[r][o : o + n] for r, o, n in zip(plan.item_read.tolist(),
                                                       plan.item_offset.tolist(),
                                                       plan.item_length.tolist())]

    async def explain(self, err: Exception, files) -> Exception:
        """`err`, or an `ObjectChangedError` if one of `files` changed since it was opened."""
        if isinstance(err, (ObjectChangedError, StoreUnavailableError)):
            return err  # already precise, or the store is not answering: don't ask it again
        for f in sorted(files):
            old = self._files[f]  # type: ignore[index]
            try:
                now = await asyncio.wait_for(self.storage.info(old.url),
                                             self.storage.retry.timeout)
            except FileNotFoundError:
                return ObjectChangedError(f"{redact(old.url)} was deleted after it was opened "
                                          f"({err})")
            except (OSError, asyncio.TimeoutError):
                return err
            if (now.size, now.version) != (old.size, old.version):
                return ObjectChangedError(
                    f"{redact(old.url)} changed after it was opened (size {old.size} -> "
                    f"{now.size}, version {old.version} -> {now.version}); re-open the "
                    f"dataset to read the new contents ({err})"
                )
        return err

    @property
    def chunk_starts(self) -> np.ndarray:
        """Global index of the first record of every chunk of every file, plus the total."""
        self._require_open()
        if self._table is None:
            self._table = _ChunkTable.build(self._indices, self._starts)
        return self._table.record_starts

    @property
    def max_group_size(self) -> int:
        self._require_open()
        return max((int(ix.chunk_records.max()) if ix.num_chunks else 1)
                   for ix in self._indices) if self._indices else 1

    def _cacheable(self, f: int) -> bool:
        return self._indices[f].group_size > 1

    def _decode_all(self, work) -> list[ChunkRecords]:
        return [self._decode(key, raw, start) for key, raw, start in work]

    def _decode(self, key: tuple[int, int], raw, start: int) -> ChunkRecords:
        f, c = key
        index = self._indices[f]
        _, records = decode_chunk(raw, start, verify=self.verify, path=index.path, chunk=c,
                                  expected_records=int(index.chunk_records[c]),
                                  max_decoded=self.storage.max_inflight_bytes, whole_range=True)
        return records

    # -- sync API ---------------------------------------------------------------------

    def read_chunk(self, file: int, chunk: int) -> ChunkRecords:
        """All records of one chunk of one file (sync)."""
        self._require_open()
        return self._sync(self.read_chunks([file], [chunk]))[(file, chunk)]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self._sync(self.read(range(*key.indices(len(self)))))
        if isinstance(key, (list, tuple, np.ndarray, range)):
            return self._sync(self.read(key))
        i = int(key)
        if i < 0:
            i += len(self)
        return self._sync(self.read([i]))[0]

    def __iter__(self):
        n = len(self)
        step = 4096
        for lo in range(0, n, step):
            yield from self[lo : min(n, lo + step)]

    # -- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release this loop's I/O resources (call from the loop you read on)."""
        kept, self.resident = self.resident, None  # read again: record by record
        if kept is not None:
            await kept.aclose()
        if self._owns_storage:
            await self.storage.aclose()

    def _sync(self, coro):
        self._used_sync = True
        return run_sync(coro, user=self)

    def close(self) -> None:
        """Release the I/O resources the sync API used (and the background loop, if last)."""
        if not self._used_sync:
            return
        self._used_sync = False
        try:
            run_sync(self.aclose())
        finally:  # a failed close (or open) still lets the background loop go
            release(self)

    def __enter__(self) -> ArrayRecordSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> ArrayRecordSource:
        try:
            await self.aopen()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = (f"{len(self._files)} files, {int(self._starts[-1]):,} records"
                 if self._files is not None else "not opened")
        more = ", ..." if len(self._patterns) > 1 else ""
        return f"ArrayRecordSource({redact(self._patterns[0])!r}{more}; {state})"
