"""The fetch stage: chunks' byte ranges in, their bytes out, through one `Storage`.

This is where records' chunk ranges become merged reads (`plan_reads`: sorted, deduplicated,
neighbours joined across small gaps) issued concurrently under the storage's limits. Files
are named by number (their place in the `RecordTable`), never by URL. Two things sit in
front of the reads:

- the memory tier (`aioloader.cache`, `resident_bytes`): a remote dataset that fits is kept
  in memory whole, and reads are served from it once its segments are in; a larger one is
  kept in part, the segments that upcoming records lie densely in (the runtime's readahead
  says which), each task's segments pinned while its workers read them (`resident_refs`);
- the raw (still compressed) chunks of files with group size > 1 stay in a byte-bounded
  LRU (`RawChunkCache`), and a chunk being fetched is shared with whoever else asks for it
  meanwhile: a chunk that several tasks (batches) touch is downloaded once. One-record
  chunks are not cached: one epoch never reads a record twice.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..cache import SEGMENT_BYTES, SegmentStore
from ..index.planning import ChunkRefs, plan_reads
from ..io.storage import ObjectChangedError, Storage, StoreUnavailableError, is_local, redact
from .table import RecordTable

Key = tuple[int, int]  # (file number, chunk number)


class RawChunkCache:
    """Raw chunk bytes by (file, chunk), least recently used out first, bounded in bytes.

    `hits` counts chunks served without a new read (cached, or shared with a read already
    in flight), `misses` the chunks read.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[Key, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Key) -> bytes | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: Key, data: bytes) -> None:
        if len(data) > self.max_bytes or key in self._items:
            return
        self._items[key] = data
        self.bytes += len(data)
        while self.bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= len(old)

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0


@dataclass(frozen=True)
class Lease:
    """Records' refs into the memory tier, valid until `release` (the task's workers are
    done reading: only then may their segments be evicted)."""

    refs: ChunkRefs
    release: Callable[[], None]


class _Abandoned(Exception):
    """The read a waiter shared failed or was cancelled: the waiter reads the chunk itself
    (and sees the error, if any, in its own context)."""


class Fetcher:
    """Fetches byte ranges of the files of one `RecordTable` through `storage`."""

    def __init__(self, storage: Storage, table: RecordTable, *, max_gap: int,
                 max_merged: int, resident_bytes: int = 0, cache_bytes: int = 0) -> None:
        self.storage = storage
        self.table = table
        self.max_gap = max_gap
        self.max_merged = max_merged
        self.raw_cache = RawChunkCache(cache_bytes)
        self._inflight: dict[Key, asyncio.Future] = {}
        self.resident: SegmentStore | None = None  # the memory tier (aioloader.cache)
        self._capacity = resident_bytes
        files = table.files
        total = sum(f.size for f in files)
        segment = max(1, min(SEGMENT_BYTES, storage.max_inflight_bytes // 4))
        if files and not any(is_local(f.url) for f in files) and \
                SegmentStore.usable(total, resident_bytes, segment):
            self.resident = SegmentStore(table.urls, [f.size for f in files],
                                         table.runs(segment), resident_bytes,
                                         self.fetch_segment)
        counts = [ix.num_chunks for ix in table.indices]
        self._first_chunk = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.segment_bytes = segment

    async def fit_segments(self, most: int) -> None:
        """Cut a bounded memory tier's segments to at most `most` bytes — a block shuffle's
        block size — before its first read. A segment holding parts of two blocks would be
        fetched once for each (they fall in windows far apart, and the first is evicted by
        then); cut by the same `RecordTable.runs`, a block is then one or more whole
        segments, fetched once per epoch."""
        kept, files = self.resident, self.table.files
        if kept is None:  # segments of the blocks' size may make a small tier usable
            if most >= self.segment_bytes or any(is_local(f.url) for f in files) or \
                    not SegmentStore.usable(sum(f.size for f in files), self._capacity, most):
                return
        elif kept.whole or not kept.unclaimed or most >= self.segment_bytes:
            return
        self.segment_bytes = max(1, int(most))
        self.resident = SegmentStore(self.table.urls, [f.size for f in files],
                                     self.table.runs(self.segment_bytes), self._capacity,
                                     self.fetch_segment)
        if kept is not None:
            await kept.aclose()

    async def fetch_segment(self, url: str, start: int, end: int, dest: memoryview) -> None:
        """Every segment the memory tier fetches comes through here (the disk tier's hook:
        look on disk, else the bucket, and keep a copy)."""
        await self.storage.read_into(url, start, end, dest)

    def segments_of_records(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The memory tier's segment and the global chunk of each global record (readahead's
        input)."""
        files, chunks, _ = self.table.locate(records)
        g = self._first_chunk[files] + chunks
        bounds = self.table.runs(self.segment_bytes).chunk
        return np.searchsorted(bounds, g, side="right") - 1, g

    # -- by records' chunk refs (the loader) ----------------------------------------------

    def check_budget(self, refs: ChunkRefs) -> None:
        """Refuse a chunk larger than the byte budget now, as Storage would on reading it
        (a worker reading it itself would not ask Storage)."""
        sizes = refs.end - refs.start
        if sizes.size and int(sizes.max()) > self.storage.max_inflight_bytes:
            k = int(sizes.argmax())
            url = self.table.urls[int(_ids(refs)[refs.file[k]])]
            self.storage.check_budget(url, int(refs.start[k]), int(refs.end[k]))

    async def fetch_refs(self, refs: ChunkRefs) -> list[memoryview]:
        """The physical bytes of each record's chunk in `refs`, one view per record."""
        files = _ids(refs)[refs.file]
        grouped = self.table.grouped[files]
        whole = self.resident is not None and self.resident.whole
        if whole or self.raw_cache.max_bytes <= 0 or not grouped.any():
            return await self.fetch_ranges(files, refs.start, refs.end)
        return await self._fetch_cached(files, refs.chunk, refs.start, refs.end, grouped)

    async def resident_refs(self, refs: ChunkRefs) -> Lease | None:
        """`refs` read from the memory tier, once their segments are in (worker processes
        read those themselves), pinned there until the lease is released; None when they
        are not served from memory: the first read, a tier that does not keep them (few
        upcoming records in their segments), or none (fetch them with `fetch_refs`)."""
        kept = self.resident
        if kept is None or kept.worker_path is None or kept.unclaimed:
            return None
        used = _ids(refs)
        files = used[refs.file]
        segs = kept.segments_of(files, refs.start, refs.end)
        if segs is None or not await kept.gate():  # not chunks' ranges; another event loop
            return None
        need = np.unique(segs)
        if not await kept.acquire(need):
            return None
        # One entry per place: file f's byte 0 sits at `shift` in the memory file (whole:
        # one per file; bounded: one per segment).
        shift = kept.loc[segs] - kept.seg_start[segs]
        places, first, inverse = np.unique(shift, return_index=True, return_inverse=True)
        names = [refs.name(f) for f in refs.file[first].tolist()]
        kept.hits += len(refs)
        out = ChunkRefs([kept.worker_path] * len(places), inverse.astype(np.int64).ravel(),
                        refs.chunk, refs.start, refs.end, refs.within, names,
                        places.tolist(), refs.count, files[first], format=refs.format)
        return Lease(out, lambda: kept.release(need))

    # -- by (file, chunk) and by byte range ---------------------------------------------

    async def fetch_chunks(self, keys: Sequence[Key]) -> dict[Key, tuple[memoryview, int]]:
        """The physical bytes of each (file, chunk), with its file offset; merged reads."""
        keys = list(dict.fromkeys(keys))
        indices = self.table.indices
        ranges = [indices[f].chunk_range(c) for f, c in keys]
        views = await self.fetch_ranges(np.array([f for f, _ in keys], dtype=np.int64),
                                        np.array([r[0] for r in ranges], np.int64),
                                        np.array([r[1] for r in ranges], np.int64))
        return {key: (view, start) for key, view, (start, _) in zip(keys, views, ranges)}

    async def fetch_ranges(self, files: np.ndarray, starts: np.ndarray,
                           ends: np.ndarray) -> list[memoryview]:
        """Byte ranges of files (by number): from resident segments when the dataset is
        kept in memory whole, else through merged range reads (the first read always: only
        once it is done do segments start coming)."""
        kept = self.resident
        if kept is None:
            return await self.read_ranges(files, starts, ends)
        files = np.asarray(files, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        segs = kept.segments_of(files, starts, ends)
        if kept.claim():
            try:
                return await self.read_ranges(files, starts, ends)
            finally:  # the first read is done (or failed): segments may come now
                kept.start(segs)
        if kept.whole and segs is not None and await kept.gate():
            return await kept.views(segs, starts, ends)
        return await self.read_ranges(files, starts, ends)

    async def read_ranges(self, files: np.ndarray, starts: np.ndarray,
                          ends: np.ndarray) -> list[memoryview]:
        """Plan the ranges into merged reads, read them concurrently, and slice each
        range back out of its read."""
        plan = plan_reads(files, starts, ends, max_gap=self.max_gap,
                          max_merged=self.max_merged)
        urls = self.table.urls
        raws = await self.storage.read_many(
            [(urls[f], s, e) for f, s, e in zip(plan.read_file.tolist(),
                                                 plan.read_start.tolist(),
                                                 plan.read_end.tolist())])
        views = [memoryview(r) for r in raws]
        return [views[r][o : o + n] for r, o, n in zip(plan.item_read.tolist(),
                                                       plan.item_offset.tolist(),
                                                       plan.item_length.tolist())]

    # -- the raw chunk cache ------------------------------------------------------------

    async def _fetch_cached(self, files: np.ndarray, chunks: np.ndarray, starts: np.ndarray,
                            ends: np.ndarray, grouped: np.ndarray) -> list[memoryview]:
        """`fetch_ranges`, with the chunks of grouped files taken from the raw cache or a
        read in flight when they can be; those read here are cached and shared."""
        cache, loop = self.raw_cache, asyncio.get_running_loop()
        keys = list(zip(files.tolist(), chunks.tolist()))
        have: dict[Key, bytes] = {}
        shared: dict[Key, asyncio.Future] = {}
        mine: dict[Key, asyncio.Future] = {}
        direct: list[int] = []  # records read here: one per chunk of a grouped file
        for i, (key, g) in enumerate(zip(keys, grouped.tolist())):
            if not g:
                direct.append(i)
            elif key in have or key in shared or key in mine:
                continue
            elif (data := cache.get(key)) is not None:
                have[key] = data
            elif (fut := self._inflight.get(key)) is not None and fut.get_loop() is loop:
                shared[key] = fut
            else:
                mine[key] = self._inflight[key] = loop.create_future()
                direct.append(i)
        cache.hits += len(have) + len(shared)
        cache.misses += len(mine)
        at = np.array(direct, dtype=np.int64)
        out: list[memoryview | None] = [None] * len(keys)
        try:
            views = await self.fetch_ranges(files[at], starts[at], ends[at]) if direct else []
        except BaseException:
            for key, fut in mine.items():
                self._settle(key, fut, None)
            raise
        for i, view in zip(direct, views):
            key = keys[i]
            fut = mine.get(key)
            if fut is None:
                out[i] = view
            else:
                data = have[key] = _own(view)
                cache.put(key, data)
                self._settle(key, fut, data)
        for key, fut in shared.items():
            try:
                have[key] = await asyncio.shield(fut)  # cancelling us leaves it to the others
            except _Abandoned:
                have[key] = await self._read_alone(key, keys.index(key), files, starts, ends)
        for i, (key, g) in enumerate(zip(keys, grouped.tolist())):
            if g:
                out[i] = memoryview(have[key])
        return out  # type: ignore[return-value]

    def _settle(self, key: Key, fut: asyncio.Future, data: bytes | None) -> None:
        """Hand a chunk read here (None: the read failed) to those waiting for it."""
        if self._inflight.get(key) is fut:
            del self._inflight[key]
        if data is not None:
            fut.set_result(data)
        else:
            fut.set_exception(_Abandoned())
            fut.exception()  # retrieved: waiters, if any, read it themselves

    async def _read_alone(self, key: Key, i: int, files: np.ndarray, starts: np.ndarray,
                          ends: np.ndarray) -> bytes:
        (view,) = await self.fetch_ranges(files[i : i + 1], starts[i : i + 1], ends[i : i + 1])
        data = _own(view)
        self.raw_cache.put(key, data)
        return data

    # -- errors and closing -------------------------------------------------------------

    async def explain(self, err: Exception, files) -> Exception:
        """`err`, or an `ObjectChangedError` if one of `files` changed since it was opened."""
        if isinstance(err, (ObjectChangedError, StoreUnavailableError)):
            return err  # already precise, or the store is not answering: don't ask it again
        for f in sorted(files):
            old = self.table.files[f]
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

    async def aclose(self) -> None:
        """Drop the memory copy and the cached chunks; later reads go to storage."""
        self.raw_cache.clear()
        kept, self.resident = self.resident, None
        if kept is not None:
            await kept.aclose()


def _ids(refs: ChunkRefs) -> np.ndarray:
    if refs.ids is None:
        raise ValueError("these ChunkRefs carry no file numbers: make them with chunk_refs()")
    return refs.ids


def _own(view: memoryview) -> bytes:
    """The bytes of `view`, not holding on to the rest of a larger merged read."""
    obj = view.obj
    if isinstance(obj, bytes) and len(obj) == view.nbytes:
        return obj
    return bytes(view)
