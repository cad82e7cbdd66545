"""Readahead for the memory tier, driven by the plan: which segments upcoming records lie in.

The output order is a pure function of the plan (`plan.index.lookup`), so before a task runs
the loader can look at the positions after it, find the segments their records lie in, and
have the memory tier fetch those that many upcoming records share (`cache.dense_segments`):
a sequential read or a block shuffle gets whole segments ahead of need, an exact shuffle
over a dataset much larger than memory keeps reading record by record. The look is taken
afresh once the run has gone half way through the last one, in growing steps (most of its
cost is the lookup, per position), so its cost per record stays small.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cache import dense_segments
from ..plan import Plan

FIRST_LOOK = 4096  # positions looked at first; then 4x as long while the budget allows
MOST_LOOK = 1 << 19  # positions looked at, at most


class Readahead:
    """Advises the memory tier of `source` (if bounded) from the plan's upcoming records."""

    def __init__(self, plan: Plan, source: Any) -> None:
        self.plan = plan
        self.source = source
        self._next = 0  # the position from which to look again
        self.looks = 0

    def use(self, plan: Plan) -> None:
        self.plan, self._next = plan, 0

    def at(self, lo: int) -> None:
        """A task starts at output position `lo`: look ahead from there, when due."""
        store = getattr(self.source, "resident", None)
        if store is None or store.whole or (self._next and lo < self._next):
            return
        plan, n = self.plan, FIRST_LOOK
        while True:
            stop = lo + n if plan.length is None else min(lo + n, plan.length)
            if stop <= lo:
                return
            records, _ = plan.index.lookup(np.arange(lo, stop, dtype=np.int64))
            segs, chunks = self.source.fetcher.segments_of_records(records)
            wanted, cut = dense_segments(segs, store.room, store.ahead_budget, store.min_count,
                                         chunks)
            if cut < len(segs) or stop - lo < n or n >= MOST_LOOK:
                break
            n *= 4
        self.looks += 1
        store.advise(wanted)
        self._next = lo + max(cut // 2, plan.unit)
