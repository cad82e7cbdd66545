"""Where a bounded memory tier's segments lie in its memory file: page-aligned places.

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

from ..storage import StorageError

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
