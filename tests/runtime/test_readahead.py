"""The runtime's readahead for the bounded memory tier (aioloader.runtime.readahead): which
segments it advises, however it is called, is what a fresh look from that position says.

A look keeps the positions it looked up, so that a later one looks up only the new ones;
that must never change the advice. Checked against fakes of the plan and the source (the
pieces it reads), with the tier's real policy (`dense_segments`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.runtime.readahead import Readahead


class _Store:
    whole = False

    def __init__(self, segments: int, budget: int, min_count: int) -> None:
        self.room = np.full(segments, 10, dtype=np.int64)
        self.ahead_budget = budget
        self.min_count = min_count
        self.advised: list[list[int]] = []

    def advise(self, wanted: np.ndarray) -> None:
        self.advised.append(wanted.tolist())


def _fakes(order: np.ndarray, per_segment: int, budget: int, min_count: int):
    """A plan whose output position p reads record `order[p]`, over segments of
    `per_segment` records (a record is its own chunk)."""
    calls: list[int] = []

    def lookup(positions):
        calls.append(len(positions))
        return order[positions], np.zeros(len(positions), dtype=np.int64)

    plan = SimpleNamespace(length=len(order), unit=4, index=SimpleNamespace(lookup=lookup))
    store = _Store(-(-len(order) // per_segment), budget, min_count)
    fetcher = SimpleNamespace(segments_of_records=lambda r: (r // per_segment, r.copy()))
    return plan, SimpleNamespace(resident=store, fetcher=fetcher), calls


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12_000), per_segment=st.sampled_from([7, 64, 1000]),
       window=st.sampled_from([1, 50, 2000]), budget=st.integers(0, 200),
       min_count=st.integers(1, 8), steps=st.lists(st.integers(1, 5000), max_size=10),
       seed=st.integers(0, 3))
def test_kept_positions_never_change_the_advice(n, per_segment, window, budget, min_count,
                                                steps, seed):
    rng = np.random.default_rng(seed)  # records shuffled within windows (a block shuffle)
    order = np.concatenate([rng.permutation(np.arange(a, min(n, a + window)))
                            for a in range(0, n, window)]).astype(np.int64)
    plan, source, _ = _fakes(order, per_segment, budget, min_count)
    kept = Readahead(source)
    lo = 0
    for step in [0, *steps]:
        lo = min(n - 1, lo + step)
        before = len(source.resident.advised)
        kept.at(lo, plan)  # type: ignore[arg-type]
        if len(source.resident.advised) == before:
            continue  # not due
        fresh_plan, fresh_source, _ = _fakes(order, per_segment, budget, min_count)
        Readahead(fresh_source).at(lo, fresh_plan)  # type: ignore[arg-type]
        assert source.resident.advised[-1] == fresh_source.resident.advised[-1]


def test_a_sequential_read_looks_each_position_up_about_once():
    n = 400_000
    plan, source, calls = _fakes(np.arange(n, dtype=np.int64), 4096, 80, 16)
    ahead = Readahead(source)
    for lo in range(0, n, 1024):
        ahead.at(lo, plan)  # type: ignore[arg-type]
    assert ahead.looks > 10
    assert sum(calls) < 1.2 * n
