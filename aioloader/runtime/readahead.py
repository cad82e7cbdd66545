"""Readahead for the memory tier, driven by the plan: which segments upcoming records lie in.

The output order is a pure function of the plan (`plan.index.lookup`), so before a task runs
the loader can look at the positions after it, find the segments their records lie in, and
have the memory tier fetch those that many upcoming records share (`cache.dense_segments`):
a sequential read or a block shuffle gets whole segments ahead of need, an exact shuffle
over a dataset much larger than memory keeps reading record by record. The look is taken
afresh once the run has gone half way through the last one, in growing steps (most of its
cost is the lookup, per position), so its cost per record stays small; positions already
looked up are kept, not looked up again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cache import dense_segments
from ..describe.plan import Plan

FIRST_LOOK = 4096  # positions looked at first; then 4x as long while the budget allows
MOST_LOOK = 1 << 19  # positions looked at, at most


class Readahead:
    """Advises the memory tier of `source` (if bounded) from the plan's upcoming records (the
    plan is the caller's, given at each look; `use` when it changed).

    The segments and chunks of the positions looked at are kept (`_segs`, `_chunks`, from
    position `_from`): a later look drops those behind it and looks up only the positions
    past the last one, so that each position is looked up about once, however often the
    tier is advised."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._next = 0  # the position from which to look again
        self.looks = 0
        self._clear()

    def _clear(self) -> None:
        self._from = 0
        self._segs = np.zeros(0, dtype=np.int64)
        self._chunks = np.zeros(0, dtype=np.int64)

    def use(self) -> None:
        """Another plan from now on: what was looked up goes."""
        self._next = 0
        self._clear()

    def at(self, lo: int, plan: Plan) -> None:
        """A task of `plan` starts at output position `lo`: look ahead from there, when
        due."""
        store = getattr(self.source, "resident", None)
        if store is None or store.whole or (self._next and lo < self._next):
            return
        self._keep_from(lo)
        n = FIRST_LOOK
        while True:
            stop = lo + n if plan.length is None else min(lo + n, plan.length)
            if stop <= lo:
                return
            self._extend(plan, lo + len(self._segs), stop)
            wanted, cut = dense_segments(self._segs, store.room, store.ahead_budget,
                                         store.min_count, self._chunks)
            if cut < len(self._segs) or stop - lo < n or n >= MOST_LOOK:
                break
            n *= 4
        self.looks += 1
        store.advise(wanted)
        self._next = lo + max(cut // 2, plan.unit)

    def _keep_from(self, lo: int) -> None:
        """Drop the positions before `lo` (all of them if `lo` is not among those kept)."""
        skip = lo - self._from
        if skip < 0 or skip > len(self._segs):
            self._clear()
            skip = 0
        self._from = lo
        self._segs, self._chunks = self._segs[skip:], self._chunks[skip:]

    def _extend(self, plan: Plan, start: int, stop: int) -> None:
        """Look up positions `start..stop-1` (past those kept) and keep theirs too."""
        if stop <= start:
            return
        records, _ = plan.index.lookup(np.arange(start, stop, dtype=np.int64))
        segs, chunks = self.source.fetcher.segments_of_records(records)
        self._segs = np.concatenate([self._segs, segs])
        self._chunks = np.concatenate([self._chunks, chunks])
