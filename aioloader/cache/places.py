"""Where the memory tier's segments lie in its memory file (`Layout`): a whole dataset's
files each at their own place; a bounded tier's segments at page-aligned places (`Places`).

Each fetch lands at a fresh place of a large sparse memory file (`VIRTUAL_BYTES` of virtual
space, not memory): a place is never reused while the space lasts (16 TiB), so the
workers' decoded-chunk caches, keyed by where bytes lie, never confuse one segment with the
one evicted before it. A freed place's pages go back to the kernel (`MADV_REMOVE`). After a
wrap of the space, a new place is kept clear of those still taken. `live` is the bytes of
places taken: what the tier's capacity bounds.
"""

from __future__ import annotations

import mmap

import numpy as np

from ..io.memfile import MemoryFile
from ..io.storage import StorageError
from .runindex import RunIndex

VIRTUAL_BYTES = 1 << 44  # the bounded memory file's size: places, not memory
PAGE = mmap.PAGESIZE


def pages(n) -> np.ndarray:
    """`n` bytes rounded up to whole pages."""
    return -(-np.asarray(n, dtype=np.int64) // PAGE) * PAGE


class Places:
    """The places of segments whose sizes in whole pages are `room`: `loc[s]` is segment
    s's place, or -1."""

    def __init__(self, room: np.ndarray) -> None:
        self.room = room
        self.loc = np.full(len(room), -1, dtype=np.int64)
        self.live = 0  # bytes of places taken
        self.peak = 0  # the most `live` has been
        self._cursor = 0  # next free place
        self._wrapped = False

    def take(self, s: int) -> int:
        """A place for segment `s`, never used since the last wrap of the virtual space
        (after one, clear of the places still taken)."""
        room = int(self.room[s])
        at = self._cursor
        if at + room > VIRTUAL_BYTES:
            at, self._wrapped = 0, True
        if self._wrapped:
            taken = sorted((int(self.loc[t]), int(self.room[t])) for t in
                           np.flatnonzero(self.loc >= 0).tolist())
            for a, n in taken:
                if a < at + room and at < a + n:
                    at = a + n
            if at + room > VIRTUAL_BYTES:
                raise StorageError("the memory tier ran out of places")  # cannot: capacity
        self._cursor = at + room
        self.loc[s] = at
        self.live += room
        self.peak = max(self.peak, self.live)
        return at

    def free(self, s: int, mem: mmap.mmap | None) -> None:
        """Segment `s`'s place is free again; its pages go back to the kernel."""
        at, room = int(self.loc[s]), int(self.room[s])
        self.loc[s] = -1
        self.live -= room
        if mem is not None and room:
            mem.madvise(mmap.MADV_REMOVE, at, room)


class Layout:
    """The memory tier's memory file and where each of the segments `index` names lies in
    it (`loc`): a tier that keeps the dataset `whole` puts every file at its own page-aligned
    place, as long as the file (each segment at its offset there); a bounded one gives each
    fetch a fresh place (`Places`; -1: none)."""

    def __init__(self, sizes: np.ndarray, index: RunIndex, whole: bool) -> None:
        self.index = index
        self.room = pages(index.end - index.start)
        self.places: Places | None = None
        if whole:
            room = pages(sizes)
            base = np.concatenate([[0], np.cumsum(room)]).astype(np.int64)
            self.loc = base[index.file] + index.start
            size = int(base[-1])
        else:
            self.places = Places(self.room)
            self.loc = self.places.loc  # the same array
            size = VIRTUAL_BYTES
        self._file = MemoryFile("aioloader-segments", size)
        self.worker_path = self._file.worker_path
        self.mem: mmap.mmap | None = self._file.map

    @property
    def live(self) -> int:
        """Bytes of a bounded tier's places taken (a whole tier's are not counted)."""
        return self.places.live if self.places is not None else 0

    @property
    def peak(self) -> int:
        return self.places.peak if self.places is not None else 0

    def take(self, s: int) -> memoryview:
        """Where segment `s`'s bytes land (a bounded tier: a fresh place, taken)."""
        if self.places is not None:
            self.places.take(s)
        at, n = int(self.loc[s]), int(self.index.end[s] - self.index.start[s])
        assert self.mem is not None
        return memoryview(self.mem)[at : at + n]

    def free(self, s: int) -> None:
        """A bounded tier's segment `s` is gone: its place is free, its pages go back."""
        assert self.places is not None
        self.places.free(s, self.mem)

    def views(self, segments: np.ndarray, starts: np.ndarray,
              ends: np.ndarray) -> list[memoryview]:
        """Bytes `[starts[i], ends[i])` of segment `segments[i]`'s file, where they lie."""
        mem = memoryview(self.mem) if self.mem is not None else memoryview(b"")  # empty
        lo = (self.loc[segments] + starts - self.index.start[segments]).tolist()
        return [mem[a : a + n] for a, n in zip(lo, (ends - starts).tolist())]

    def close(self) -> None:
        """Let go of the memory file (views still held: unmapped with them)."""
        if self.places is not None:
            self.places.live = 0
        self.mem = None
        self._file.close()
