"""bucket_by_length's decisions (pure): tf.data's bucketing, and a resume place of a few
integers from which a replay gives the same batches."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.elements.bucketing import Buckets, bucket_of
from aioloader.errors import StateError


@st.composite
def streams(draw):
    bounds = sorted(draw(st.sets(st.integers(1, 30), min_size=1, max_size=4)))
    sizes = draw(st.lists(st.integers(1, 5), min_size=len(bounds) + 1,
                          max_size=len(bounds) + 1))
    lengths = draw(st.lists(st.integers(0, 35), max_size=60))
    return bounds, sizes, lengths, draw(st.booleans())


def naive(bounds, sizes, lengths, drop):
    """tf.data's bucketing, written the obvious way: (bucket, element indices) per batch."""
    buckets = [[] for _ in sizes]
    out = []
    for i, n in enumerate(lengths):
        b = sum(1 for x in bounds if x <= n)
        buckets[b].append(i)
        if len(buckets[b]) == sizes[b]:
            out.append((b, buckets[b]))
            buckets[b] = []
    if not drop:
        out += [(b, q) for b, q in enumerate(buckets) if q]
    return out


def run(bounds, sizes, lengths, drop, start=0, skips=()):
    """Feed elements `start..` (tags are their indices): (bucket, items, place) per batch."""
    buckets = Buckets(sizes, drop, skips)
    out = []
    for i in range(start, len(lengths)):
        out += buckets.add(i, i, bucket_of(lengths[i], bounds), i + 1)
    return out + buckets.finish(len(lengths))


@given(streams())
def test_the_batches_are_tf_datas(case):
    assert [(b, items) for b, items, _ in run(*case)] == naive(*case)


@given(streams())
def test_every_place_replays_the_rest_bit_for_bit(case):
    bounds, sizes, lengths, drop = case
    batches = run(*case)
    for k, (_, _, (start, skips)) in enumerate(batches):
        assert len(skips) == len(sizes)  # a few integers, whatever is pending
        rest = run(bounds, sizes, lengths, drop, start, skips)
        assert [(b, items) for b, items, _ in rest] == [(b, i) for b, i, _ in batches[k + 1:]]
        # and the places after a replayed batch resume as well as the first run's
        assert [p for _, _, p in rest] == [p for _, _, p in batches[k + 1:]]


@given(st.lists(st.integers(1, 100), min_size=1, max_size=5, unique=True),
       st.integers(0, 120))
def test_an_element_goes_to_the_bucket_its_boundaries_bracket(bounds, length):
    bounds = sorted(bounds)
    b = bucket_of(length, bounds)
    assert (b == 0 or bounds[b - 1] <= length) and (b == len(bounds) or length < bounds[b])


def test_a_state_of_other_buckets_is_refused():
    with pytest.raises(StateError, match="'buckets' has 2 counts, but bucket_by_length"):
        Buckets([2, 2, 2], skips=(0, 1))


@pytest.mark.parametrize("args, kw, error, match", [
    (([10, 5], [1, 2, 3]), {}, ValueError, r"boundaries must be strictly increasing, but "
                                            r"boundaries\[1\] = 5 follows 10"),
    (([5, 5], [1, 2, 3]), {}, ValueError, r"boundaries must be strictly increasing"),
    (([5, 10], [1, 2]), {}, ValueError, r"batch_sizes must have len\(boundaries\) \+ 1 = 3"),
    (([], [4]), {}, ValueError, r"boundaries must name at least one length"),
    (([0], [1, 2]), {}, ValueError, r"boundaries\[0\] must be >= 1"),
    (([4], [1, 0]), {}, ValueError, r"batch_sizes\[1\] must be >= 1"),
    (([4.5], [1, 2]), {}, TypeError, r"boundaries\[0\] must be an integer"),
    ((5, [1, 2]), {}, TypeError, r"boundaries must be a list"),
    (([4], [1, 2]), {"pad": {"tokens": 0}}, ValueError, r"bucket_by_length\(\) pad\['tokens'\] "
                                                         r"= 0 is not a length"),
    (([4], [1, 2]), {"pad": True, "truncate": True}, ValueError, "truncate=True"),
    (([4], [1, 2]), {"drop_remainder": 1}, TypeError, "drop_remainder must be True or False"),
])
def test_bad_arguments_are_refused_naming_them(args, kw, error, match):
    ds = al.Dataset.from_source([b"x"])
    with pytest.raises(error, match=match):
        ds.bucket_by_length(len, *args, **kw)


def test_boundaries_and_sizes_may_be_numpy_arrays():
    ds = al.Dataset.from_source([b"x"])
    op = ds.bucket_by_length(len, np.array([4, 8]), np.array([8, 4, 2], np.int32)).batching
    assert op.boundaries == (4, 8) and op.batch_sizes == (8, 4, 2)
    assert all(type(x) is int for x in op.boundaries + op.batch_sizes)
    with pytest.raises(TypeError, match=r"boundaries\[0\] must be an integer"):
        ds.bucket_by_length(len, np.array([4.5]), [1, 2])
    with pytest.raises(TypeError, match=r"boundaries must be a list .* of shape \(1, 1\)"):
        ds.bucket_by_length(len, np.array([[4]]), [1, 2])


def test_it_is_the_batching_step():
    ds = al.Dataset.from_source([b"x"])
    with pytest.raises(TypeError, match="length_fn must be a function"):
        ds.bucket_by_length(3, [4], [1, 2])
    with pytest.raises(ValueError, match="cannot follow batch"):
        ds.batch(2).bucket_by_length(len, [4], [1, 2])
    with pytest.raises(ValueError, match="batch\\(\\) cannot follow it"):
        ds.bucket_by_length(len, [4], [1, 2]).batch(2)
    bucketed = ds.bucket_by_length(len, [4], [1, 2])
    with pytest.raises(ValueError, match=r"shuffle\(\) must come before bucket_by_length\(\)"):
        bucketed.shuffle(1)
    with pytest.raises(ValueError, match=r"FilterOp after bucket_by_length\(\) is not supported"):
        bucketed.filter(bool)
    with pytest.raises(ValueError, match=r"pack\(\) cannot follow bucket_by_length\(\)"):
        bucketed.pack({"t": 4}, num_packing_bins=2)
    assert ds.bucket_by_length(len, [4, 8], [8, 4, 2], drop_remainder=True, pad={"t": 16},
                               pad_value=-1).describe()[-1] == (
        "bucket_by_length(len, boundaries=[4, 8], batch_sizes=[8, 4, 2], drop_remainder, "
        "pad={'t': 16}, pad_value=-1)")


@pytest.mark.parametrize("skips, lengths, why", [
    ((0, 10**6, 0), [1, 6, 1, 1], "bucket 0 fills before them"),  # more than it can have given
    ((0, 3, 0), [6, 6], "the data ends before them"),  # still owed at the end
    ((0, 0, 1), [], "the data ends before them"),
])
def test_buckets_counts_that_cannot_be_consumed_are_refused(skips, lengths, why):
    with pytest.raises(StateError, match=rf"'buckets' says .* were delivered, but {why}"):
        run([4, 8], [2, 2, 2], lengths, False, 0, skips)
    with pytest.raises(StateError, match="'buckets'"):  # dropped remainders are no excuse
        run([4, 8], [2, 2, 2], lengths, True, 0, skips)


def test_the_bookkeeping_is_linear_in_the_pending_items_and_buckets():
    buckets, each = 1000, 20
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        b = Buckets([each + 1] * buckets)
        for i in range(buckets * each):  # every bucket holds some: none fills
            assert b.add(None, i, i % buckets, i + 1) == []
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert b.pending == buckets * each
    assert used < 4 << 20, used
    assert b.place(0) == (0, (0,) * buckets)
