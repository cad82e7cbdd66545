"""The disk tier in the loader: records from local segment files where they are on disk,
from the bucket where not, while a background download fills the disk.

Segments are the table's runs of whole chunks of about `SEGMENT_BYTES` (`RecordTable.runs`),
so a record never straddles two. A task whose records all lie in segments on disk is
redirected to the entries (`local_refs`): worker processes read them themselves, like local
files (`ChunkRefs.read_from`: a byte `b` of the object is at `PAYLOAD_AT + b - start` of
the entry of the segment `[start, end)`). A task with some records still remote gets them
all as bytes (`fetch_refs`): those on disk read here (a thread, a pread each), the rest
through the bucket (under an exact shuffle nearly every task is mixed until the disk holds
nearly everything: asking the bucket again for those on disk would waste requests).

The filler (`start_filler`) downloads whole segments, file by file, a few at a time (a
bounded share of `io_concurrency`), each once per host: a segment another process is
downloading is skipped and picked up afterwards, when that process has stored it. It stops
when every segment is on disk, or when the cache refuses one (full of recently used
entries). Segments another process stored are found by the filler's pass (reads never stat
the disk per record). Once every segment is on disk, tasks grow as over local files
(`complete`).

The memory tier above (aioloader.cache.segments) fetches its segments — the same runs —
through `fetch_into`: from the entry when on disk, else downloaded (once per host, like the
filler's) straight into the memory tier's place and stored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..planning import ChunkRefs
from .budget import GRACE_S
from .disk import PAYLOAD_AT, DiskCache, SegmentKey, entry_size
from .segments import SEGMENT_BYTES

log = logging.getLogger("aioloader")

TOUCH_S = GRACE_S / 4  # a segment in use is stamped again after this long
_POLL_S = (0.005, 0.25)  # waiting for another process's download: first, most
_DISK, _BUSY, _FULL, _SKIP = "disk", "busy", "full", "skip"  # how a segment request ended
FULL_BACKOFF_S = 10.0  # after the cache refused a segment, the memory tier stores none


class DiskTier:
    """Segments of the files of one `RecordTable` (`table`) in `cache`, fetched through
    `storage` (`read(url, start, end)`)."""

    def __init__(self, cache: DiskCache, table: Any, storage: Any,
                 segment: int = SEGMENT_BYTES) -> None:
        self.cache = cache
        self.table = table
        self.storage = storage
        runs = table.runs(segment)
        self.run_file, self.run_start, self.run_end = runs.file, runs.start, runs.end
        files = table.files
        self.keys = [SegmentKey(files[f].url, files[f].version, s, e) for f, s, e in
                     zip(runs.file.tolist(), runs.start.tolist(), runs.end.tolist())]
        # Files without a version could be rewritten unseen: never cached.
        self.cacheable = np.array([bool(files[f].version) for f in runs.file.tolist()],
                                  dtype=bool)
        self.paths = [cache.path(k) for k in self.keys]
        self._shift = (PAYLOAD_AT - runs.start).tolist()
        # The run of a (file, offset): runs are in file order, byte order within a file.
        counts = np.bincount(runs.file, minlength=len(files)) if len(runs) else \
            np.zeros(len(files), dtype=np.int64)
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # File f's byte b is key base[f] + b: the runs' keys then ascend across all files.
        sizes = np.array([f.size + 1 for f in files], dtype=np.int64)
        self._base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self._run_key = self._base[runs.file] + runs.start
        self.have = np.zeros(len(runs), dtype=bool)  # on disk, proved by this process
        names = {os.path.basename(p) for p in self.paths}
        there = names.intersection(os.listdir(cache.dir_fd))  # stored before: prove on use
        self._listed = np.array([os.path.basename(p) in there for p in self.paths], dtype=bool)
        self._complete = False  # see `complete`
        self._file_of = {f.url: i for i, f in enumerate(files)}
        self._full_until = 0.0
        self._closed = False
        self.segments_local = 0  # the memory tier's segments read from disk
        self._known: list[tuple[int, int] | None] = [None] * len(runs)
        self._stamp = np.zeros(len(runs), dtype=np.float64)
        self._inflight: dict[int, asyncio.Future] = {}
        self._filler: asyncio.Task | None = None
        self._proving: asyncio.Lock | None = None
        # The disk work (checks, reads, writes) runs on threads of our own, so that closing
        # waits for them all before the directory's descriptor goes.
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="aioloader-disk")
        self._fill_lanes = 0  # the filler's concurrency, once asked for
        self._first_done = False
        self.filled = False  # the filler finished: everything it could store is on disk
        self.records_local = self.records_remote = 0
        self.downloads = 0  # segments this process downloaded

    def __len__(self) -> int:
        return len(self.keys)

    def runs_of(self, refs: ChunkRefs) -> np.ndarray:
        """The segment of each record in `refs`: one search over all files' runs, ordered
        by (file, start) as one key (a loop over files cost ~5 µs a record in the parent)."""
        files = refs.ids[refs.file]  # type: ignore[index]  # set for files
        out = np.searchsorted(self._run_key, self._base[files] + refs.start, "right") - 1
        if len(out) and ((out < self._first[files]) | (out >= self._first[files + 1])).any():
            raise AssertionError("a record outside its file's segments")
        return out

    # -- the loader's calls -------------------------------------------------------------

    def complete(self) -> bool:
        """Whether every segment is on disk (or listed there, to be proved on first use):
        tasks may then grow as over local files."""
        if not self._complete:
            self._complete = bool((self.have | self._listed).all())
        return self._complete

    async def local_refs(self, refs: ChunkRefs) -> ChunkRefs | None:
        """`refs` read from the segment files when every record's segment is on disk (the
        workers read them); None when some are not (see `fetch_refs`)."""
        if refs.ids is None or not len(refs):
            return None
        runs = self.runs_of(refs)
        used, inverse = np.unique(runs, return_inverse=True)
        await self._prove(used)
        if not self.have[used].all() or not self._touch(used):
            return None
        self.records_local += len(refs)
        names = [refs.name(f) for f in np.searchsorted(refs.ids, self.run_file[used]).tolist()]
        u = used.tolist()
        return ChunkRefs(paths=[self.paths[r] for r in u], file=inverse.astype(np.int64),
                         chunk=refs.chunk, start=refs.start, end=refs.end,
                         within=refs.within, names=names,
                         shift=[self._shift[r] for r in u], count=refs.count,
                         ids=self.run_file[used].astype(np.int64),
                         idents=[self._known[r] for r in u])  # type: ignore[misc]  # all proved

    async def fetch_refs(self, refs: ChunkRefs, fetch: Any) -> list[Any]:
        """The physical bytes of each record's chunk: from the segment files for those on
        disk, through `fetch(refs_subset)` (the source's `fetch_refs`) for the others."""
        runs = self.runs_of(refs)
        await self._prove(np.unique(runs))
        local = self.have[runs]
        out: list[Any] = [None] * len(refs)
        if local.any():
            idx = np.flatnonzero(local)
            got = await self._thread(self._read_local, runs[idx], refs.start[idx],
                                          refs.end[idx])
            for i, b in zip(idx.tolist(), got):
                out[i] = b
            local[idx] = [b is not None for b in got]
        miss = np.flatnonzero(~local)
        if miss.size:
            try:
                views = await fetch(_subset(refs, miss))
            finally:
                if not self._first_done:
                    self._first_done = True
                    self._start_fill()
            for i, v in zip(miss.tolist(), views):
                out[i] = v
        self.records_local += len(refs) - int(miss.size)
        self.records_remote += int(miss.size)
        return out

    async def _prove(self, runs: np.ndarray) -> None:
        """Check the entries, stored before this process started, of these segments."""
        if not self._listed[runs].any():
            return
        if self._proving is None:
            self._proving = asyncio.Lock()
        async with self._proving:  # a task finds the proofs it needs done, not under way
            todo = runs[self._listed[runs] & ~self.have[runs]]
            if todo.size:
                await self._thread(lambda: [self._found_now(r) for r in todo.tolist()])
                self._listed[todo] = False
                self._complete = False  # (one may have failed its proof)

    def _read_local(self, runs: np.ndarray, starts: np.ndarray,
                    ends: np.ndarray) -> list[bytes | None]:
        """(A thread.) Records' bytes from their segments' entries; None where an entry
        vanished or went bad (it is then fetched from the bucket, and forgotten here)."""
        out: list[bytes | None] = [None] * len(runs)
        order = np.argsort(runs, kind="stable")
        bounds = np.flatnonzero(np.diff(runs[order])) + 1
        for group in np.split(order, bounds):
            r = int(runs[group[0]])
            got = self.cache.read(self.keys[r], self._known[r],
                                  list(zip(starts[group].tolist(), ends[group].tolist())))
            if got is None:
                self.have[r], self._known[r], self._complete = False, None, False
                continue
            for i, b in zip(group.tolist(), got):
                out[i] = b
        return out

    def _touch(self, used: np.ndarray) -> bool:
        """Stamp segments in use (for the LRU, and so no one evicts them while a worker may
        open them); False if one has vanished (it is forgotten)."""
        now = time.monotonic()
        for r in used[now - self._stamp[used] > TOUCH_S].tolist():
            try:
                os.utime(self.paths[r])
            except OSError:
                self.have[r], self._known[r], self._complete = False, None, False
                return False
            self._stamp[r] = now
        return True

    # -- segments -----------------------------------------------------------------------

    async def fetch_segment(self, r: int, *, wait: bool = True) -> bool:
        """Make segment `r` be on disk: found there (checked), or downloaded once per host
        (locked) and stored. False when it could not be stored (no room, a file without a
        version), or (`wait=False`) another process is downloading it now."""
        return await self._segment(r, wait) == _DISK

    async def fetch_into(self, url: str, start: int, end: int, dest: memoryview) -> None:
        """The memory tier's `FetchSegment` (aioloader.cache.segments): its segments are the
        disk tier's, read from disk when there, else downloaded (once per host) into `dest`
        and stored, so a later epoch or job over a filled cache asks the bucket nothing."""
        r = self._run_at(url, start, end)
        if r is None or not self.cacheable[r] or self._closed:
            await self.storage.read_into(url, start, end, dest)
            return
        await self._prove(np.array([r]))
        if self.have[r] and await self._thread(self._read_into, r, dest):
            self.segments_local += 1
            return
        if time.monotonic() < self._full_until:  # the cache refused one lately: no scans
            await self.storage.read_into(url, start, end, dest)
            return
        box: list[Any] = [dest, False]  # filled by this call's download, if it is the one
        status = await self._segment(r, True, box)
        if box[1]:
            return
        if status == _DISK and await self._thread(self._read_into, r, dest):
            self.segments_local += 1
            return
        await self.storage.read_into(url, start, end, dest)

    def _run_at(self, url: str, start: int, end: int) -> int | None:
        """The segment that is exactly bytes [start, end) of `url`, if any."""
        f = self._file_of.get(url)
        if f is None:
            return None
        r = int(np.searchsorted(self._run_key, self._base[f] + start, "right")) - 1
        if r < 0 or self.run_file[r] != f or self.run_start[r] != start or \
                self.run_end[r] != end:
            return None
        return r

    def _read_into(self, r: int, dest: memoryview) -> bool:
        """(A thread.) Segment `r` from its entry into `dest`; False (and forgotten) when the
        entry vanished or went bad."""
        known = self.cache.read_into(self.keys[r], self._known[r], dest)
        if known is None:
            self.have[r], self._known[r], self._complete = False, None, False
            return False
        self._known[r] = known
        return True

    async def _segment(self, r: int, wait: bool, box: list | None = None) -> str:
        if self.have[r]:
            return _DISK
        fut = self._inflight.get(r)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = self._inflight[r] = asyncio.get_running_loop().create_future()
        try:
            status = await self._ensure(r, wait, box)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as err:
            fut.set_exception(err)
            fut.exception()  # retrieved: a waiter, if any, sees it
            raise
        else:
            fut.set_result(status)
        finally:
            self._inflight.pop(r, None)
        return status

    async def _ensure(self, r: int, wait: bool, box: list | None) -> str:
        """`_segment`'s work; `box` ([dest, False]): download into dest (and say so)."""
        if not self.cacheable[r]:
            return _SKIP
        key, cache = self.keys[r], self.cache
        if await self._found(r):
            return _DISK
        delay = _POLL_S[0]
        while (lock := cache.try_lock(key)) is None:  # ~20 µs: never left to a thread
            if not wait:
                return _BUSY
            await asyncio.sleep(delay)  # another process is downloading it
            delay = min(2 * delay, _POLL_S[1])
        try:
            if await self._found(r):  # stored by the process we waited for
                return _DISK
            if not await self._thread(cache.make_room, entry_size(key.end - key.start)):
                self._full_until = time.monotonic() + FULL_BACKOFF_S
                return _FULL  # checked before downloading: no bytes fetched for nothing
            if box is None:
                data: Any = await self.storage.read(key.url, key.start, key.end)
            else:
                data = box[0][: key.end - key.start]
                await self.storage.read_into(key.url, key.start, key.end, data)
                box[1] = True
            self.downloads += 1
            known = await self._thread(cache.store, key, data)
        finally:
            lock.release()
        if known is None:
            self._full_until = time.monotonic() + FULL_BACKOFF_S
            return _FULL
        self.have[r], self._known[r], self._stamp[r] = True, known, time.monotonic()
        return _DISK

    async def _found(self, r: int) -> bool:
        return await self._thread(self._found_now, r)

    def _found_now(self, r: int) -> bool:
        """(A thread.) Whether segment `r`'s entry is on disk and passes its checks."""
        known = self.cache.verify(self.keys[r])
        if known is None:
            return False
        self.have[r], self._known[r], self._stamp[r] = True, known, time.monotonic()
        return True

    # -- the background filler ----------------------------------------------------------

    def start_filler(self, concurrency: int, *, now: bool = False) -> None:
        """Download every segment not on disk, `concurrency` at a time, in the background:
        once the first read is done (`now`: at once), so the first batch does not wait
        behind whole segments."""
        self._fill_lanes = max(1, concurrency)
        if now or self._first_done:
            self._start_fill()

    def _start_fill(self) -> None:
        if self._filler is None and self._fill_lanes and len(self):
            self._filler = asyncio.ensure_future(self._fill(self._fill_lanes))

    async def _fill(self, concurrency: int) -> None:
        full = False

        async def lane(todo: list[int], wait: bool, skipped: list[int]) -> None:
            nonlocal full
            while todo and not full:
                r = todo.pop()
                if not self.cacheable[r]:
                    continue
                status = await self._segment(r, wait)
                if status == _FULL:
                    full = True  # refused: the cache holds what it can
                elif status == _BUSY:
                    skipped.append(r)

        try:
            for wait in (False, True):  # a segment being downloaded elsewhere: later
                todo = [int(r) for r in np.flatnonzero(~self.have)[::-1]]
                skipped: list[int] = []
                await asyncio.gather(*(lane(todo, wait, skipped) for _ in range(concurrency)))
                if full or not skipped:
                    break
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the filler only saves time: reads go on without it
            log.warning("disk cache: background fill stopped: %s", err)
        self.filled = True

    def _thread(self, fn: Any, *args: Any) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def aclose(self) -> None:
        self._closed = True  # the memory tier's fetches go to the bucket from now on
        t, self._filler = self._filler, None
        if t is not None:
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)
        self.cache.close()

    def figures(self) -> dict[str, Any]:
        return {"disk_segments": int(self.have.sum()), "disk_total_segments": len(self),
                "disk_records_local": self.records_local,
                "disk_records_remote": self.records_remote,
                "disk_downloads": self.downloads, "disk_filled": self.filled,
                "disk_segments_read": self.segments_local,
                "disk_dropped": self.cache.dropped, "disk_evicted": self.cache.evicted}


def _subset(refs: ChunkRefs, idx: np.ndarray) -> ChunkRefs:
    """Records `idx` of `refs` (naming the same files)."""
    return ChunkRefs(refs.paths, refs.file[idx], refs.chunk[idx], refs.start[idx],
                     refs.end[idx], refs.within[idx], refs.names, refs.shift,
                     refs.count[idx] if refs.count is not None else None, refs.ids)
