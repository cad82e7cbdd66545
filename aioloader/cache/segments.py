"""The memory tier: segments of a remote dataset in one memory file, bounded in bytes.

Under an exact global shuffle every record is its own range request, and a request costs
the client a fixed cost in CPU and the store a round trip, whatever its size. Whenever many
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
bucket, and keep a copy). This module owns the segments' states and serving reads; where
they lie is `places`', which to keep and fetch ahead `keeping`', the fetches under way
`inflight`'.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from ..index.planning import CLOUD_MAX_GAP, Runs
from ..io.memfile import shareable
from ..io.storage import StorageError
from .firstread import FirstRead
from .inflight import InFlight
from .keeping import Keeping
from .places import Layout
from .runindex import RunIndex

SEGMENT_BYTES = 4 << 20
AHEAD_FRACTION = 1.0  # of the capacity, for the segments of upcoming records
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
        idx = self.index = RunIndex(sizes_, runs)  # where each segment lies in its file
        self.seg_file, self.seg_start, self.seg_end = idx.file, idx.start, idx.end
        n = len(self.seg_file)
        self.whole = int(sizes_.sum()) <= self.capacity
        self.layout = Layout(sizes_, self.index, self.whole)
        self.room, self.loc = self.layout.room, self.layout.loc
        self.worker_path = self.layout.worker_path
        self._state = np.zeros(n, dtype=np.int8)
        self._keep = Keeping(n)  # pins, readahead's wants, the LRU
        self._fetching = InFlight()
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
        return self.layout.live

    @property
    def peak(self) -> int:
        """The most bytes of places taken at once (bounded: at most `capacity`)."""
        return self.layout.peak if not self.whole else self.bytes

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
        return self.index.of(np.asarray(files, dtype=np.int64),
                             np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))

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
        return self.layout.views(segments, starts, ends)

    async def acquire(self, segments: np.ndarray) -> bool:
        """Pin `segments` (distinct) and wait until they are resident; False (nothing
        pinned): not served from memory, read the records directly. A bounded tier fetches
        only segments readahead wants (dense), and only while there is room."""
        missing = segments[self._state[segments] == _MISSING]
        if not self.whole and missing.size and not self._keep.wanted[missing].all():
            return False
        if (self._state[segments] != _RESIDENT).any():
            self.waits += 1  # readahead was late (or not asked): the task waits
        self._keep.pins[segments] += 1
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
        self._keep.used(segments)
        return True

    def release(self, segments: np.ndarray) -> None:
        """Unpin what `acquire` pinned (the task's workers are done reading)."""
        if self._closed:
            return
        self._keep.pins[segments] -= 1
        self._readahead()

    # -- readahead --------------------------------------------------------------------

    def advise(self, wanted: np.ndarray) -> None:
        """The segments that upcoming records lie densely in, in first-use order: fetch
        them as room allows; those no longer wanted go first when room is needed."""
        if self.whole or self._closed:
            return
        self._keep.advise(wanted)
        self._readahead()

    def _readahead(self) -> None:
        if self.whole or not self.started or self._closed:
            return
        keep = self._keep
        while (s := keep.next_ahead(lambda s: self._state[s] == _MISSING)) is not None:
            if not self._make_room(int(self.room[s]), demand=False):
                return
            keep.take_ahead()
            self._start_one(s, ahead=True)

    # -- places, fetches, evictions ---------------------------------------------------

    def _make_room(self, need: int, *, demand: bool) -> bool:
        if self.whole:
            return True
        if need > self.capacity:
            return False
        while self.live + need > self.capacity:
            victim = self._keep.victim(demand)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _evict(self, s: int) -> None:
        self._keep.dropped(s)
        self._state[s] = _MISSING
        self.bytes -= int(self.seg_end[s] - self.seg_start[s])
        self.evictions += 1
        self.layout.free(s)

    def _start_one(self, s: int, ahead: bool = False) -> None:
        self._state[s] = _FETCHING
        dest = self.layout.take(s)  # the bytes land in place
        f, start, end = int(self.seg_file[s]), int(self.seg_start[s]), int(self.seg_end[s])
        self._fetching.start(s, self.fetch_segment(self.urls[f], start, end, dest),
                             functools.partial(self._landed, s, dest=dest, ahead=ahead))

    def _landed(self, s: int, task: asyncio.Task, dest: memoryview, ahead: bool) -> None:
        n = len(dest)
        dest.release()  # the map closes only once no view of it is left
        if ahead:
            self._keep.running -= 1
        if self.layout.mem is None:  # released (closing) while this read was finishing
            return
        if task.cancelled() or task.exception() is not None:
            self._state[s] = _MISSING  # a later read asks again (half written: rewritten)
            if not self.whole:
                self.layout.free(s)
        else:
            self._state[s] = _RESIDENT
            self._keep.resident(s)
            self.bytes += n
            self.fetched += 1
            self.fetched_bytes += n
        self._readahead()

    async def _wait(self, segments: np.ndarray) -> None:
        """Until these segments are resident; the first failure is raised. Waiting is not
        owning: a cancelled reader leaves the shared fetches running for the others."""
        await self._fetching.wait(segments)
        if self._closed:
            raise _closed()

    async def aclose(self) -> None:
        """Cancel the fetches still running and drop the segments; later reads are refused
        (and so start no fetch while this one waits for the cancelled ones)."""
        self._closed = True
        self._first.wake()  # those waiting for the first read see the close
        await self._fetching.cancel()
        self._state[:] = _MISSING
        self._keep.clear()
        self.bytes = 0
        self.layout.close()


def _closed() -> StorageError:
    return StorageError("the in-memory copy of the dataset is closed: open the source again "
                        "to read from it")
