"""The memory tier: segments of a remote dataset in one memory file, bounded in bytes.

Under an exact global shuffle every record is its own range request, and a request costs
the client ~150 µs of CPU and the store a round trip, whatever its size. Whenever many
records that will be read soon lie together, one large read is the better trade. The files
are cut into segments — runs of whole chunks of about 4 MiB (`RecordTable.runs`: a record
never straddles two) — and a segment is fetched whole, once, into memory that the worker
processes read their records from themselves (`worker_path` + an offset: the parent handles
no record bytes).

Two regimes, one store:

- *whole*: the dataset fits `capacity` (`resident_bytes`). Every file has its own place in
  the memory file; a segment is fetched the first time a record in it is needed and stays
  for the life of the source, so a later epoch costs no request at all.
- *bounded*: the dataset is larger. Segments are fetched when the plan says that many
  upcoming records lie in them (`advise`, see `aioloader.cache.readahead`) and evicted,
  least recently used first, once no task in flight still reads them (`acquire` pins a
  task's segments until its workers are done, `release`). Each fetch lands at a fresh
  place of a large sparse memory file (`places`), and an evicted one's pages go back.

The very first read still goes record by record, alone (`firstread`). A failed segment is
forgotten, so a later read fetches it again. Every fetch goes through
`fetch_segment(url, start, end, dest)` — the hook a disk tier wraps (look on disk, else the
bucket, and keep a copy). This module owns the segments' states, pins and the LRU; where
they lie is `places`'.
"""

from __future__ import annotations

import asyncio
import mmap
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from ..memfile import MemoryFile, shareable
from ..planning import CLOUD_MAX_GAP, Runs
from ..storage import StorageError
from .firstread import FirstRead
from .places import VIRTUAL_BYTES, Places, pages

SEGMENT_BYTES = 4 << 20
AHEAD_FRACTION = 1.0  # of the capacity, for the segments of upcoming records
AHEAD_FETCHES = 16  # segment fetches in flight for readahead (tasks' own are not counted)
MIN_SEGMENTS = 4  # a bounded tier holds at least this many segments, or is not used
TASK_FRACTION = 8  # a task it serves reads at most this fraction of a bounded tier

_MISSING, _FETCHING, _RESIDENT = 0, 1, 2

FetchSegment = Callable[[str, int, int, memoryview], Awaitable[None]]


class SegmentStore:
    """Segments `runs` of the files `urls` (sizes `sizes`) in memory, within `capacity`
    bytes, fetched through `fetch_segment` (Storage.read_into, or a tier wrapping it).
    Segment s, once resident, sits at `loc[s]` of the memory file `worker_path` names."""

    def __init__(self, urls: Sequence[str], sizes: Sequence[int], runs: Runs, capacity: int,
                 fetch_segment: FetchSegment) -> None:
        self.urls = list(urls)
        self.capacity = int(capacity)
        self.fetch_segment = fetch_segment
        sizes_ = np.asarray(sizes, dtype=np.int64)
        self.seg_file = np.asarray(runs.file, dtype=np.int64)
        self.seg_start = np.asarray(runs.start, dtype=np.int64)
        self.seg_end = np.asarray(runs.end, dtype=np.int64)
        n = len(self.seg_file)
        self._fbase = np.concatenate([[0], np.cumsum(sizes_)]).astype(np.int64)
        self._key = self._fbase[self.seg_file] + self.seg_start  # ascending: runs in order
        self.room = pages(self.seg_end - self.seg_start)
        self.whole = int(sizes_.sum()) <= self.capacity
        self._places: Places | None = None
        if self.whole:  # every file at its own page-aligned place, as long as the source
            room = pages(sizes_)
            base = np.concatenate([[0], np.cumsum(room)]).astype(np.int64)
            self.loc = base[self.seg_file] + self.seg_start
            size = int(base[-1])
        else:
            self._places = Places(self.room)
            self.loc = self._places.loc  # the same array: where each segment lies, or -1
            size = VIRTUAL_BYTES
        self._state = np.zeros(n, dtype=np.int8)
        self._pins = np.zeros(n, dtype=np.int32)
        self._wanted = np.zeros(n, dtype=bool)
        self._ahead: list[int] = []  # wanted segments in first-use order, not yet started
        self._lru: OrderedDict[int, None] = OrderedDict()  # resident, oldest use first
        self._file = MemoryFile("aioloader-segments", size)
        self.worker_path = self._file.worker_path
        self._mem: mmap.mmap | None = self._file.map
        self._fetching: dict[int, asyncio.Task] = {}
        self._ahead_running = 0
        self.bytes = 0  # bytes resident now
        self.fetched = 0  # segments fetched, and their bytes
        self.fetched_bytes = 0
        self.evictions = 0
        self.waits = 0  # tasks that waited for a segment to land
        self.hits = 0  # records read from the tier (counted by the fetch stage)
        self._first = FirstRead()
        self._closed = False

    @classmethod
    def usable(cls, total: int, capacity: int, target: int) -> bool:
        """Whether a tier of `capacity` bytes serves a dataset of `total` bytes cut into
        segments of about `target`: it fits whole, or the bounded tier can hold a few
        segments and workers can open its memory file."""
        return 0 < total <= capacity or (capacity >= MIN_SEGMENTS * target and shareable())

    @property
    def unclaimed(self) -> bool:
        """No read has started yet: the next one is the first, made directly."""
        return self._first.unclaimed

    @property
    def started(self) -> bool:
        """The first read is done: segments are coming, reads wait for them."""
        return self._first.started

    @property
    def live(self) -> int:
        """Bytes of places taken, fetching and resident (bounded: within `capacity`)."""
        return self._places.live if self._places is not None else 0

    @property
    def peak(self) -> int:
        """The most bytes of places taken at once (bounded: at most `capacity`)."""
        return self._places.peak if self._places is not None else self.bytes

    @property
    def resident(self) -> int:
        """Segments in memory now."""
        return int((self._state == _RESIDENT).sum())

    @property
    def ahead_budget(self) -> int:
        """Bytes of segments readahead may plan for."""
        return int(self.capacity * AHEAD_FRACTION)

    @property
    def task_bytes(self) -> int:
        """The most stored bytes one task should read from a bounded tier: tasks in flight
        pin their segments, and a task that cannot get room is read record by record."""
        return self.capacity // TASK_FRACTION

    @property
    def min_count(self) -> int:
        """Upcoming records in a segment for fetching it to beat reading them one by one (a
        request costs about what ~256 KiB of transfer does)."""
        target = int(np.median(self.seg_end - self.seg_start)) if len(self.seg_end) else 0
        return max(4, -(-target // CLOUD_MAX_GAP))

    # -- where ranges lie -------------------------------------------------------------

    def segments_of(self, files, starts, ends) -> np.ndarray | None:
        """The segment each range `[starts[i], ends[i])` of file `files[i]` lies in; None
        if one lies in none (not a chunk's range)."""
        files = np.asarray(files, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        if not len(self._key):
            return None if files.size else np.zeros(0, dtype=np.int64)
        seg = np.searchsorted(self._key, self._fbase[files] + starts, side="right") - 1
        s = np.maximum(seg, 0)
        ok = (seg >= 0) & (self.seg_file[s] == files) & (ends <= self.seg_end[s])
        return seg if bool(ok.all()) else None

    # -- the first read ---------------------------------------------------------------

    def claim(self) -> bool:
        """True for the first read (on this event loop): make it directly, then call
        `start`."""
        if self._closed:
            raise _closed()
        return self._first.claim()

    async def gate(self) -> bool:
        """Wait until the first read is done (`start`); False on another event loop (read
        directly)."""
        if self._closed:
            raise _closed()
        if not await self._first.wait():
            return False
        if self._closed:
            raise _closed()
        return True

    def start(self, segments: np.ndarray | None = None) -> None:
        """The first read is done (or failed): segments may come now; a whole dataset
        fetches those of the first read's ranges."""
        if self._closed or not self._first.start():
            return
        if self.whole and segments is not None:
            for s in np.unique(segments).tolist():
                if self._state[s] == _MISSING:
                    self._start_one(s)
        self._readahead()

    # -- serving reads ----------------------------------------------------------------

    async def views(self, segments: np.ndarray, starts: np.ndarray,
                    ends: np.ndarray) -> list[memoryview]:
        """Bytes `[starts[i], ends[i])` of segment `segments[i]`'s file, once resident
        (whole tier only: views of a bounded tier would outlive an eviction)."""
        assert self.whole
        need = np.unique(segments)
        for s in need[self._state[need] == _MISSING].tolist():
            self._start_one(s)
        await self._wait(need)
        if self._closed:  # while we waited
            raise _closed()
        mem = memoryview(self._mem) if self._mem is not None else memoryview(b"")  # empty
        lo = (self.loc[segments] + starts - self.seg_start[segments]).tolist()
        return [mem[a : a + n] for a, n in zip(lo, (ends - starts).tolist())]

    async def acquire(self, segments: np.ndarray) -> bool:
        """Pin `segments` (distinct) and wait until they are resident; False (nothing
        pinned): not served from memory, read the records directly. A bounded tier fetches
        only segments readahead wants (dense), and only while there is room."""
        missing = segments[self._state[segments] == _MISSING]
        if not self.whole and missing.size and not self._wanted[missing].all():
            return False
        if (self._state[segments] != _RESIDENT).any():
            self.waits += 1  # readahead was late (or not asked): the task waits
        self._pins[segments] += 1
        try:
            for s in missing.tolist():
                if self._state[s] != _MISSING:
                    continue
                if not self._make_room(int(self.room[s]), demand=True):
                    self.release(segments)
                    return False
                self._start_one(s)
            await self._wait(segments)
        except BaseException:
            self.release(segments)
            raise
        for s in segments.tolist():
            self._lru.move_to_end(s)
        return True

    def release(self, segments: np.ndarray) -> None:
        """Unpin what `acquire` pinned (the task's workers are done reading)."""
        if self._closed:
            return
        self._pins[segments] -= 1
        self._readahead()

    # -- readahead --------------------------------------------------------------------

    def advise(self, wanted: np.ndarray) -> None:
        """The segments that upcoming records lie densely in, in first-use order: fetch
        them as room allows; those no longer wanted go first when room is needed."""
        if self.whole or self._closed:
            return
        self._wanted[:] = False
        self._wanted[wanted] = True
        self._ahead = [s for s in wanted.tolist()[::-1]]  # a stack: next at the end
        self._readahead()

    def _readahead(self) -> None:
        if self.whole or not self.started or self._closed:
            return
        while self._ahead and self._ahead_running < AHEAD_FETCHES:
            s = self._ahead[-1]
            if self._state[s] != _MISSING or not self._wanted[s]:
                self._ahead.pop()
                continue
            if not self._make_room(int(self.room[s]), demand=False):
                return
            self._ahead.pop()
            self._ahead_running += 1
            self._start_one(s, ahead=True)

    # -- places, fetches, evictions ---------------------------------------------------

    def _make_room(self, need: int, *, demand: bool) -> bool:
        if self.whole:
            return True
        if need > self.capacity:
            return False
        while self.live + need > self.capacity:
            victim = self._victim(demand)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _victim(self, demand: bool) -> int | None:
        """The least recently used unpinned segment not wanted ahead (on demand: or
        wanted, if that is all there is)."""
        pins, wanted = self._pins, self._wanted
        fallback = None
        for s in self._lru:
            if pins[s] == 0:
                if not wanted[s]:
                    return s
                if fallback is None:
                    fallback = s
        return fallback if demand else None

    def _evict(self, s: int) -> None:
        self._lru.pop(s, None)
        self._state[s] = _MISSING
        self.bytes -= int(self.seg_end[s] - self.seg_start[s])
        self.evictions += 1
        self._free(s)

    def _free(self, s: int) -> None:
        assert self._places is not None
        self._places.free(s, self._mem)

    def _start_one(self, s: int, ahead: bool = False) -> None:
        self._state[s] = _FETCHING
        if self._places is not None:
            self._places.take(s)
        f, start, end = int(self.seg_file[s]), int(self.seg_start[s]), int(self.seg_end[s])
        at = int(self.loc[s])
        assert self._mem is not None
        dest = memoryview(self._mem)[at : at + end - start]  # the bytes land in place
        task = asyncio.ensure_future(self.fetch_segment(self.urls[f], start, end, dest))
        self._fetching[s] = task
        task.add_done_callback(lambda t, s=s, dest=dest, ahead=ahead:  # type: ignore[misc]
                               self._landed(s, t, dest, ahead))

    def _landed(self, s: int, task: asyncio.Task, dest: memoryview, ahead: bool) -> None:
        self._fetching.pop(s, None)
        n = len(dest)
        dest.release()  # the map closes only once no view of it is left
        if ahead:
            self._ahead_running -= 1
        if self._mem is None:  # released (closing) while this read was finishing
            return
        if task.cancelled() or task.exception() is not None:
            self._state[s] = _MISSING  # a later read asks again (half written: rewritten)
            if not self.whole:
                self._free(s)
        else:
            self._state[s] = _RESIDENT
            self._lru[s] = None
            self.bytes += n
            self.fetched += 1
            self.fetched_bytes += n
        self._readahead()

    async def _wait(self, segments: np.ndarray) -> None:
        """Until these segments are resident; the first failure is raised. Waiting is not
        owning: a cancelled reader leaves the shared fetches running for the others."""
        tasks = [self._fetching[s] for s in segments.tolist() if s in self._fetching]
        if tasks:
            await asyncio.wait(tasks)
        for t in tasks:
            if t.cancelled():
                raise StorageError("a segment read was cancelled: the source is closing")
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        if self._closed:
            raise _closed()

    async def aclose(self) -> None:
        """Cancel the fetches still running and drop the segments; later reads are refused
        (and so start no fetch while this one waits for the cancelled ones)."""
        self._closed = True
        self._first.wake()  # those waiting for the first read see the close
        while self._fetching:
            tasks = list(self._fetching.items())
            for _, t in tasks:
                t.cancel()
            await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
            for s, _ in tasks:
                self._fetching.pop(s, None)
        self._state[:] = _MISSING
        self._lru.clear()
        self.bytes = 0
        if self._places is not None:
            self._places.live = 0
        self._mem = None
        self._file.close()  # views still held: unmapped with them


def _closed() -> StorageError:
    return StorageError("the in-memory copy of the dataset is closed: open the source again "
                        "to read from it")
