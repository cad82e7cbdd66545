"""What a bounded memory tier keeps, and what it fetches next: the pins of tasks in flight,
the segments readahead wants (in first-use order, a few fetches at a time), and the order of
use of the others, least recently used out first.

Policy only: the store (`segments`) owns the segments' states, places and fetches, and asks
here which segment to fetch ahead next (`next_ahead`) and which to evict for room (`victim`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

AHEAD_FETCHES = 16  # segment fetches in flight for readahead (tasks' own are not counted)


class Keeping:
    """The pins, wants and order of use of `n` segments."""

    def __init__(self, n: int) -> None:
        self.pins = np.zeros(n, dtype=np.int32)  # tasks in flight reading each segment
        self.wanted = np.zeros(n, dtype=bool)  # upcoming records lie densely in it
        self.running = 0  # readahead fetches in flight
        self._ahead: list[int] = []  # wanted segments in first-use order, not yet started
        self._lru: OrderedDict[int, None] = OrderedDict()  # resident, oldest use first

    def advise(self, wanted: np.ndarray) -> None:
        """The segments that upcoming records lie densely in, in first-use order."""
        self.wanted[:] = False
        self.wanted[wanted] = True
        self._ahead = [s for s in wanted.tolist()[::-1]]  # a stack: next at the end

    def next_ahead(self, missing: Callable[[int], bool]) -> int | None:
        """The next wanted segment still `missing`, while fewer than AHEAD_FETCHES run
        (`take_ahead` once its fetch starts); None: none now."""
        while self._ahead and self.running < AHEAD_FETCHES:
            s = self._ahead[-1]
            if missing(s) and self.wanted[s]:
                return s
            self._ahead.pop()
        return None

    def take_ahead(self) -> None:
        """The segment `next_ahead` named is being fetched."""
        self._ahead.pop()
        self.running += 1

    def resident(self, s: int) -> None:
        """Segment `s` landed: the most recently used."""
        self._lru[s] = None

    def used(self, segments: np.ndarray) -> None:
        """A task reads these resident segments: the most recently used."""
        for s in segments.tolist():
            self._lru.move_to_end(s)

    def dropped(self, s: int) -> None:
        self._lru.pop(s, None)

    def victim(self, demand: bool) -> int | None:
        """The least recently used unpinned segment not wanted ahead (on demand: or wanted,
        if that is all there is)."""
        pins, wanted = self.pins, self.wanted
        fallback = None
        for s in self._lru:
            if pins[s] == 0:
                if not wanted[s]:
                    return s
                if fallback is None:
                    fallback = s
        return fallback if demand else None

    def clear(self) -> None:
        self._lru.clear()
