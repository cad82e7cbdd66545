"""The pure mix/concatenate selection (`aioloader.index.selection`): Grain's order and length,
exact proportions, every record of finite inputs at most once (concatenate: exactly once),
determinism, and the composition with index plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.index.indexplan import IndexPlan
from aioloader.index.sampling import Repeat, Shuffle, Slice
from aioloader.index.selection import (
    MixedIndex,
    concat_select,
    grain_select,
    mix_length,
    proportions,
    select,
)

grain_mix = pytest.importorskip("grain._src.python.dataset.transformations.mix")

WEIGHTS = st.lists(st.sampled_from([1, 2, 3, 0.5, 0.3, 1.7, 5, 0.01, 7.25]), min_size=1,
                   max_size=5)


@settings(max_examples=200, deadline=None)
@given(weights=WEIGHTS, ks=st.lists(st.integers(0, 2**62 - 1), min_size=1, max_size=20))
def test_grain_order_and_integer_proportions_at_any_position(weights, ks):
    props = proportions(weights, len(weights))
    assert list(props) == list(grain_mix._float_to_int_proportions(weights))
    which, key = grain_select(np.array(ks, dtype=np.int64), props)
    for k, w, j in zip(ks, which.tolist(), key.tolist(), strict=True):
        assert (w, j) == grain_mix._dataset_and_key_of_next_element(k, tuple(props))


@settings(max_examples=100, deadline=None)
@given(weights=WEIGHTS, seed=st.one_of(st.none(), st.integers(0, 2**63)),
       periods=st.integers(1, 3), start=st.integers(0, 2**40))
def test_each_period_takes_exactly_its_weight_of_slots_from_each_input(weights, seed,
                                                                      periods, start):
    """Within a period of W = sum(props) positions, input i gives exactly its next p_i
    elements; so every prefix is within p_i (Grain's order: 1) of its share."""
    props = proportions(weights, len(weights))
    w = sum(props)
    first = start * w
    k = first + np.arange(periods * w, dtype=np.int64)
    which, key = select(k, props, seed)
    bound = len(props) if seed is None else max(props)
    for i, p in enumerate(props):
        mine = key[which == i]
        assert sorted(mine.tolist()) == list(range(start * p, (start + periods) * p))
        counts = np.cumsum(which == i)
        share = np.arange(1, len(k) + 1) * p / w
        assert np.abs(counts - share).max() <= bound
    again = select(k, props, seed)
    assert np.array_equal(again[0], which) and np.array_equal(again[1], key)


@settings(max_examples=100, deadline=None)
@given(weights=WEIGHTS, data=st.data(), seed=st.one_of(st.none(), st.integers(0, 2**32)))
def test_a_finite_mix_reads_each_record_at_most_once_and_has_grains_length(weights, data,
                                                                           seed):
    import grain

    n = len(weights)
    lengths = data.draw(st.lists(st.one_of(st.none(), st.integers(1, 300)), min_size=n,
                                 max_size=n))
    props = proportions(weights, n)
    length = mix_length(lengths, props, seed)
    if all(x is None for x in lengths):
        assert length is None
        return
    which, key = select(np.arange(length, dtype=np.int64), props, seed)
    for i, m in enumerate(lengths):
        mine = key[which == i].tolist()
        assert len(set(mine)) == len(mine)
        if m is not None:
            assert all(0 <= j < m for j in mine)
    if seed is None:  # Grain's length, and Grain's elements
        parents = [grain.MapDataset.range(m if m is not None else 10**12) for m in lengths]
        sel = grain_mix.SelectionWithProportionsMap(parents, weights)
        assert length == len(sel)
        got = [(int(w), int(j)) for w, j in zip(which, key, strict=True)]
        assert got == [sel[k] for k in range(length)]


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 50), min_size=1, max_size=6))
def test_concatenation_takes_every_record_exactly_once_in_order(lengths):
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    which, key = concat_select(np.arange(int(starts[-1])), starts)
    assert [(int(w), int(j)) for w, j in zip(which, key, strict=True)] == \
        [(i, j) for i, m in enumerate(lengths) for j in range(m)]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4), seed=st.integers(0, 99),
       epochs=st.integers(1, 3))
def test_mixed_index_offsets_records_and_hands_epochs_to_the_inputs(sizes, seed, epochs):
    """A repeat after a concatenation: every epoch takes every record once, and each
    input's shuffle is re-keyed per epoch (Grain: epoch n of a concatenation is epoch n of
    its inputs)."""
    inputs = tuple(IndexPlan(n, [Shuffle(seed + i)]) for i, n in enumerate(sizes))
    offsets = tuple(int(x) for x in np.cumsum([0, *sizes[:-1]]))
    cat = MixedIndex(inputs, offsets)
    total = sum(sizes)
    plan = IndexPlan(total, [Repeat(epochs)], base=cat)
    records, eps = plan.lookup(np.arange(total * epochs))
    for e in range(epochs):
        got = records[e * total:(e + 1) * total]
        assert sorted(got.tolist()) == list(range(total))
        assert (eps[e * total:(e + 1) * total] == e).all()
        for i, n in enumerate(sizes):  # the input's own shuffle at epoch e
            want = inputs[i].lookup(np.arange(n), np.full(n, e))[0] + offsets[i]
            assert got[offsets[i]:offsets[i] + n].tolist() == want.tolist()


def test_mixed_index_refuses_what_cannot_be_laid_end_to_end():
    with pytest.raises(ValueError, match="repeats forever"):
        MixedIndex((IndexPlan(3, []), IndexPlan(3, [Repeat(None)])), (0, 3))
    with pytest.raises(ValueError, match="input 1 is empty"):
        MixedIndex((IndexPlan(3, []), IndexPlan(0, [])), (0, 3), (1, 1))
    with pytest.raises(ValueError, match="weights must be finite and > 0"):
        proportions([1, 0], 2)
    with pytest.raises(ValueError, match="2 weights for 3"):
        proportions([1, 2], 3)
    with pytest.raises(ValueError, match="too uneven"):
        proportions([1, 1e6], 2)


def test_an_endless_mix_is_sliced_by_position():
    inputs = (IndexPlan(5, [Repeat(None)]), IndexPlan(7, [Shuffle(1), Repeat(None)]))
    mix = MixedIndex(inputs, (0, 5), (100, 200), 3)
    assert mix.length is None
    plan = IndexPlan(12, [Slice(300, 1200)], base=mix)  # whole periods of 300
    records, epochs = plan.lookup(np.arange(900))
    assert ((records < 5).sum(), (records >= 5).sum()) == (300, 600)
    assert epochs.max() > 50  # input 0 went round many times
