"""A small remote dataset kept in memory: fetched in large segments, each read once.

Under an exact global shuffle every record is its own range request, and a request costs
the client ~150 µs of CPU and the store a round trip, whatever its size: from a bucket that
holds a loader to a few thousand records/s per core however many requests are in flight.
When the files of a remote dataset together fit the memory allowed (`resident_bytes`),
record-by-record is the wrong trade. Each file is instead cut into fixed segments (4 MiB:
a few dozen requests for a 100 MB dataset, read at network speed); the first time a record
in a segment is needed the whole segment is fetched, and it stays for the life of the
source, so a later epoch costs no request at all. What is read, and so the batches, is
unchanged: only how the bytes arrive.

The very first read still goes record by record, alone, and only once it is done do
segments start coming (`start`): the time to the first batch neither waits for whole
segments nor competes with them. Reads that arrive meanwhile wait for that start, then,
like every later read, for their segments. A failed segment is forgotten, so a
later read fetches it again.

The files land in one memory file, each at its own page-aligned offset (Linux:
`memfd_create`, not limited by /dev/shm, one descriptor however many files, gone with the
last one; elsewhere an anonymous map). Reads in this process are views of it; worker
processes open it as `/proc/<pid>/fd/<n>` and read their records themselves, as they do
local files, so the parent handles no record bytes.
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from .memfile import MemoryFile
from .storage import StorageError

SEGMENT_BYTES = 4 << 20

_MISSING, _FETCHING, _RESIDENT = 0, 1, 2
_PAGE = mmap.PAGESIZE


class ResidentFiles:
    """A set of files in memory, each filled segment by segment on first use through
    `read_into(url, start, end, dest)`. File `k` sits at `base[k]` of the memory file that
    `worker_path` (Linux) names for other processes."""

    def __init__(self, urls: Sequence[str], sizes: Sequence[int], read_into: Any,
                 segment: int = SEGMENT_BYTES) -> None:
        if segment <= 0:
            raise ValueError("segment must be positive")
        self.urls = list(urls)
        self.segment = segment
        self._read_into = read_into  # (url, start, end, dest): Storage.read_into
        counts = np.array([-(-int(s) // segment) for s in sizes], dtype=np.int64)
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        n = int(self.first[-1])
        self.seg_file = np.repeat(np.arange(len(self.urls), dtype=np.int64), counts)
        self.seg_start = (np.arange(n, dtype=np.int64) - self.first[self.seg_file]) * segment
        self.seg_end = np.minimum(self.seg_start + segment,
                                  np.asarray(sizes, dtype=np.int64)[self.seg_file])
        self._state = np.zeros(n, dtype=np.int8)
        room = -(-np.asarray(sizes, dtype=np.int64) // _PAGE) * _PAGE
        self.base = np.concatenate([[0], np.cumsum(room)]).astype(np.int64)
        total = int(self.base[-1])
        self._file = MemoryFile("aioloader-resident", total)
        self.worker_path = self._file.worker_path
        self._mem: mmap.mmap | None = self._file.map
        self._fetching: dict[int, asyncio.Task] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.bytes = 0  # resident now
        self.started = False  # segments are coming: from now on, reads wait for them
        self._direct = False  # the first read is being made directly
        self._go: asyncio.Event | None = None  # set by `start`
        self._closed = False

    @property
    def unclaimed(self) -> bool:
        """No read has started yet: the next `views` call makes the first, direct read."""
        return not self.started and not self._direct

    @property
    def resident(self) -> int:
        """Segments in memory now."""
        return int((self._state == _RESIDENT).sum())

    async def views(self, files: np.ndarray, starts: np.ndarray,
                    ends: np.ndarray) -> list[memoryview] | None:
        """Bytes `[starts[i], ends[i])` of file `files[i]`, from resident segments,
        fetching those not yet asked for.

        None for the first read (and on another event loop): read the ranges directly,
        then call `start`, which the reads arriving meanwhile wait for.
        """
        files = np.asarray(files, dtype=np.int64)
        if not await self.ensure(files, starts, ends):
            return None
        if self._closed:  # while we waited
            raise _closed()
        mem = memoryview(self._mem) if self._mem is not None else memoryview(b"")  # all empty
        at = self.base[files]
        lo = (at + np.asarray(starts, dtype=np.int64)).tolist()
        return [mem[a:b] for a, b in zip(lo, (at + np.asarray(ends, dtype=np.int64)).tolist())]

    async def ensure(self, files: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> bool:
        """Wait until the ranges are resident (fetching their segments); False for the
        first read (and on another event loop): read it directly, then call `start`."""
        if self._closed:
            raise _closed()
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._go = loop, asyncio.Event()
        elif self._loop is not loop:
            return False
        if not self.started:
            if not self._direct:
                self._direct = True
                return False
            await self._go.wait()  # type: ignore[union-attr]
        need = self._segments(files, starts, ends)
        self._fetch(need)
        absent = need[self._state[need] != _RESIDENT]
        if absent.size:
            await self._wait(absent.tolist())
        return True

    def start(self, files: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """Start fetching the segments of these ranges (just read directly, or failed to
        be); from now on `views` serves every read."""
        if self._loop is not asyncio.get_running_loop() or self.started or self._closed:
            return
        self.started = True
        self._go.set()  # type: ignore[union-attr]
        self._fetch(self._segments(files, starts, ends))

    def _segments(self, files, starts, ends) -> np.ndarray:
        """Every segment the ranges need."""
        files = np.asarray(files, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        g0 = self.first[files] + starts // self.segment
        g1 = self.first[files] + (np.maximum(ends, starts + 1) - 1) // self.segment
        used = ends > starts  # an empty range needs no segment
        counts = (g1 - g0 + 1)[used]  # a range (a large chunk) may cover many segments
        skip = np.repeat(np.cumsum(counts) - counts, counts)
        return np.unique(np.repeat(g0[used], counts) + np.arange(int(counts.sum())) - skip)

    def _fetch(self, segments: np.ndarray) -> None:
        for g in segments[self._state[segments] == _MISSING].tolist():
            self._start_one(g)

    def _start_one(self, g: int) -> None:
        self._state[g] = _FETCHING
        f, start, end = int(self.seg_file[g]), int(self.seg_start[g]), int(self.seg_end[g])
        at = int(self.base[f]) + start
        assert self._mem is not None
        dest = memoryview(self._mem)[at : at + end - start]  # the bytes land in place
        task = asyncio.ensure_future(self._read_into(self.urls[f], start, end, dest))
        self._fetching[g] = task
        task.add_done_callback(lambda t, g=g, dest=dest: self._landed(g, t, dest))

    def _landed(self, g: int, task: asyncio.Task, dest: memoryview) -> None:
        self._fetching.pop(g, None)
        n = len(dest)
        dest.release()  # the map closes only once no view of it is left
        if self._mem is None:  # released (closing) while this read was finishing
            return
        if task.cancelled() or task.exception() is not None:
            self._state[g] = _MISSING  # a later read asks again (half written: rewritten)
            return
        self._state[g] = _RESIDENT
        self.bytes += n

    async def _wait(self, segments: list[int]) -> None:
        """Until these segments are resident; the first failure is raised. Waiting is not
        owning: a cancelled reader leaves the shared fetches running for the others."""
        tasks = [self._fetching[g] for g in segments if g in self._fetching]
        if tasks:
            await asyncio.wait(tasks)
        for t in tasks:
            if t.cancelled():
                raise StorageError("a segment read was cancelled: the source is closing")
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    async def aclose(self) -> None:
        """Cancel the fetches still running and drop the segments; later reads are refused
        (and so start no fetch while this one waits for the cancelled ones)."""
        self._closed = True
        while self._fetching:
            tasks = list(self._fetching.items())
            for _, t in tasks:
                t.cancel()
            await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
            for g, _ in tasks:
                self._fetching.pop(g, None)
        self._state[:] = _MISSING
        self.bytes = 0
        self._release()

    def _release(self) -> None:
        self._mem = None
        self._file.close()  # views still held: unmapped with them


def _closed() -> StorageError:
    return StorageError("the in-memory copy of the dataset is closed: open the source again "
                        "to read from it")

