"""Property tests of the sampler: permutations, block windows, epochs, shards, slices, plans."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.index.indexplan import IndexPlan
from aioloader.index.permutation import _epoch_keys
from aioloader.index.sampling import (
    BlockShuffle,
    Repeat,
    Shard,
    Shuffle,
    Slice,
    block_shuffle,
    epoch_key,
    feistel_permute,
    mix64,
)

KEYS = st.integers(0, 2**64 - 1)


def is_permutation(values: np.ndarray, n: int) -> bool:
    return values.shape == (n,) and bool(np.all(np.bincount(values, minlength=n) == 1))


# ----------------------------------------------------------------------------- mixing, keys


def test_mix64_is_splitmix64_and_agrees_on_scalars_and_arrays():
    # splitmix64 seeded with 0: the first output is the finalizer of the golden gamma.
    assert mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    xs = np.array([0, 1, 2, 2**63, 2**64 - 1], dtype=np.uint64)
    out = mix64(xs)
    assert out.dtype == np.uint64
    assert [int(v) for v in out] == [mix64(int(v)) for v in xs]
    assert mix64(-1) == mix64(2**64 - 1)  # taken modulo 2^64
    assert np.array_equal(mix64(np.array([-1], dtype=np.int64)), mix64(xs[-1:]))
    assert len(np.unique(mix64(np.arange(100_000, dtype=np.uint64)))) == 100_000


def test_epoch_keys_are_distinct_and_reproducible():
    keys = {epoch_key(seed, epoch) for seed in range(20) for epoch in range(500)}
    assert len(keys) == 20 * 500
    assert epoch_key(3, 4) == epoch_key(3, 4)
    assert epoch_key(3, 4, salt=1) != epoch_key(3, 4)
    assert all(0 <= k < 2**64 for k in keys)
    assert epoch_key(-1, 0) == epoch_key(2**64 - 1, 0)
    epochs = np.array([0, 1, 5, 2**40, 2**62])
    vectorized = _epoch_keys(-3, epochs)
    assert vectorized.tolist() == [epoch_key(-3, int(e)) for e in epochs]


# ----------------------------------------------------------------------------- feistel


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 17, 1000, 2**16, 2**20 + 7])
def test_feistel_is_a_permutation(n):
    assert is_permutation(feistel_permute(np.arange(n), n, key=12345), n)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5000), KEYS, st.integers(1, 8))
def test_feistel_is_a_permutation_for_any_size_key_and_rounds(n, key, rounds):
    out = feistel_permute(np.arange(n), n, key, rounds=rounds)
    assert out.dtype == np.int64
    assert is_permutation(out, n)


def test_feistel_is_reproducible_and_pointwise():
    n = 10_007
    full = feistel_permute(np.arange(n), n, 99)
    assert np.array_equal(full, feistel_permute(np.arange(n), n, 99))
    pos = np.array([[5, 0], [10_006, 77]])
    assert np.array_equal(feistel_permute(pos, n, 99), full[pos])  # any position, any shape


@pytest.mark.parametrize("n", [10, 11, 100, 4097])
def test_different_keys_and_epochs_give_different_orders(n):
    orders = {tuple(feistel_permute(np.arange(n), n, k)) for k in range(20)}
    assert len(orders) == 20
    orders = {tuple(feistel_permute(np.arange(n), n, epoch_key(1, e))) for e in range(20)}
    assert len(orders) == 20
    assert len({tuple(feistel_permute(np.arange(n), n, epoch_key(s, 0))) for s in range(5)}) == 5


def test_feistel_edges_and_errors():
    assert feistel_permute(np.arange(0), 0, 1).shape == (0,)
    assert np.array_equal(feistel_permute(np.zeros(3, dtype=np.int64), 1, 1), [0, 0, 0])
    for bad in ([-1], [10], [0, 3, 10]):
        with pytest.raises(ValueError, match="outside"):
            feistel_permute(np.array(bad), 10, 1)
    with pytest.raises(ValueError):
        feistel_permute(np.array([0]), 0, 1)
    with pytest.raises(TypeError):
        feistel_permute(np.array([0.5]), 10, 1)
    big = 2**62 + 3  # halves of 32 bits: the top of the int64 range still works
    out = feistel_permute(np.array([0, 1, big - 1]), big, 5)
    assert len(set(out.tolist())) == 3 and out.min() >= 0 and out.max() < big


# ----------------------------------------------------------------------------- block shuffle

layouts = st.lists(st.integers(0, 40), min_size=0, max_size=30)


def closed_segments(chunk_ids: np.ndarray, counts: np.ndarray) -> list[set[int]]:
    """Split a stream of chunk ids into minimal runs that consume whole chunks."""
    remaining = counts.copy()
    segments, current, open_chunks = [], set(), 0
    for c in chunk_ids.tolist():
        if c not in current:
            current.add(c)
            open_chunks += 1
        remaining[c] -= 1
        if remaining[c] == 0:
            open_chunks -= 1
            if open_chunks == 0:
                segments.append(current)
                current = set()
    assert not current
    return segments


@settings(max_examples=200, deadline=None)
@given(layouts, st.integers(1, 8), KEYS)
def test_block_shuffle_is_a_permutation_within_windows(counts, window, key):
    counts = np.array(counts, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    n = int(starts[-1])
    out = block_shuffle(np.arange(n), starts, key, window)
    assert is_permutation(out, n)
    chunk_of = np.searchsorted(starts, out, side="right") - 1
    # Implementation-independent: each run that consumes whole chunks spans <= window chunks.
    assert all(len(seg) <= window for seg in closed_segments(chunk_of, counts))
    # As specified: chunks in Feistel order, grouped `window` at a time, windows in order.
    k = len(counts)
    order = feistel_permute(np.arange(k), k, key)
    slot_of_chunk = np.empty(k, dtype=np.int64)
    slot_of_chunk[order] = np.arange(k)
    window_of = slot_of_chunk[chunk_of] // window
    assert np.all(np.diff(window_of) >= 0)
    # Pointwise evaluation agrees with the full evaluation.
    if n:
        pos = np.array([n - 1, 0, n // 2])
        assert np.array_equal(block_shuffle(pos, starts, key, window), out[pos])


def test_block_shuffle_window_one_keeps_chunks_together_and_shuffles_inside():
    counts = np.array([1000, 0, 700, 1300, 1])
    starts = np.concatenate(([0], np.cumsum(counts)))
    out = block_shuffle(np.arange(starts[-1]), starts, 5, window=1)
    chunk_of = np.searchsorted(starts, out, side="right") - 1
    assert np.count_nonzero(np.diff(chunk_of)) == 3  # 4 non-empty chunks, each in one run
    first = out[chunk_of == 0]
    assert not np.array_equal(first, np.arange(1000))  # shuffled inside the chunk
    assert not np.array_equal(
        block_shuffle(np.arange(starts[-1]), starts, 6, window=2), out
    )  # another key, another order


def test_block_shuffle_errors():
    starts = np.array([0, 3, 5])
    with pytest.raises(ValueError, match="outside"):
        block_shuffle(np.array([5]), starts, 1, 2)
    with pytest.raises(ValueError, match="window"):
        block_shuffle(np.array([0]), starts, 1, 0)
    with pytest.raises(ValueError, match="prefix"):
        block_shuffle(np.array([0]), np.array([1, 3]), 1, 1)
    with pytest.raises(ValueError, match="prefix"):
        block_shuffle(np.array([0]), np.array([0, 3, 2]), 1, 1)
    assert block_shuffle(np.arange(0), np.array([0]), 1, 1).shape == (0,)


# ----------------------------------------------------------------------------- plans


def test_shuffle_repeat_covers_every_record_once_per_epoch_and_epochs_differ():
    n, epochs = 1000, 4
    plan = IndexPlan(n, [Shuffle(seed=7), Repeat(epochs)])
    assert plan.length == n * epochs and plan.epoch_length == n
    records, ep = plan.lookup(np.arange(plan.length))
    assert np.array_equal(ep, np.arange(plan.length) // n)
    per_epoch = records.reshape(epochs, n)
    for e in range(epochs):
        assert is_permutation(per_epoch[e], n)
    assert len({tuple(row) for row in per_epoch}) == epochs
    assert not np.array_equal(per_epoch[0], np.arange(n))


def test_block_shuffle_in_a_plan_is_rekeyed_per_epoch():
    counts = [50, 0, 20, 80, 33]
    starts = np.concatenate(([0], np.cumsum(counts)))
    n = int(starts[-1])
    plan = IndexPlan(n, [BlockShuffle(3, 2), Repeat(2)], chunk_starts=starts)
    records, _ = plan.lookup(np.arange(2 * n))
    a, b = records[:n], records[n:]
    assert is_permutation(a, n) and is_permutation(b, n) and not np.array_equal(a, b)
    assert np.array_equal(a, block_shuffle(np.arange(n), starts, epoch_key(3, 0), 2))


def test_infinite_repeat_addresses_any_position():
    n, seed = 1001, 11
    plan = IndexPlan(n, [Shuffle(seed), Repeat(None), Shard(1, 4)])
    assert plan.length is None
    p = np.array([0, 1, 10**15, 3 * 10**15 + 17])
    records, ep = plan.lookup(p)
    src = 1 + 4 * p  # strided shard, then repeat
    assert np.array_equal(ep, src // n)
    expected = [feistel_permute(np.array([s % n]), n, epoch_key(seed, s // n))[0] for s in src]
    assert records.tolist() == [int(x) for x in expected]
    with pytest.raises(IndexError):
        plan.lookup(np.array([-1]))
    # A batch spanning many epochs agrees with looking each position up alone.
    many = np.arange(0, 4 * n * 300, 1237)
    records, _ = plan.lookup(many)
    assert records.tolist() == [int(plan.lookup(np.array([q]))[0][0]) for q in many]


def test_nested_repeats_rekey_inner_shuffle_and_report_outer_epoch():
    n = 100
    plan = IndexPlan(n, [Shuffle(1), Repeat(2), Repeat(3)])
    assert plan.length == 600 and plan.epoch_length == 200
    records, ep = plan.lookup(np.arange(600))
    assert np.array_equal(ep, np.arange(600) // 200)  # the outermost repeat's count
    passes = records.reshape(6, n)
    assert all(is_permutation(row, n) for row in passes)
    assert len({tuple(row) for row in passes}) == 6  # inner shuffle keyed on 2*outer + inner
    expected = feistel_permute(np.arange(n), n, epoch_key(1, 5))
    assert np.array_equal(passes[5], expected)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 300), st.integers(1, 9), st.booleans(), st.booleans())
def test_shards_are_disjoint_and_cover(n, count, contiguous, drop):
    parts = []
    for index in range(count):
        plan = IndexPlan(n, [Shard(index, count, contiguous=contiguous, drop_remainder=drop)])
        parts.append(plan.lookup(np.arange(plan.length))[0])
    lengths = [len(p) for p in parts]
    allrec = np.concatenate(parts)
    assert len(np.unique(allrec)) == len(allrec)  # disjoint
    if drop:
        assert lengths == [n // count] * count
    else:
        assert sorted(allrec.tolist()) == list(range(n))  # cover
        if contiguous:
            expected = np.array_split(np.arange(n), count)
            assert all(np.array_equal(a, b) for a, b in zip(parts, expected))
        else:
            assert all(np.array_equal(p, np.arange(i, n, count)) for i, p in enumerate(parts))


def test_shards_after_shuffle_repeat_split_each_epoch():
    n, count = 1000, 4
    got = []
    for index in range(count):
        plan = IndexPlan(n, [Shuffle(2), Repeat(3), Shard(index, count, drop_remainder=True)])
        assert plan.length == 750 and plan.epoch_length == 250
        records, ep = plan.lookup(np.arange(plan.length))
        assert np.array_equal(ep, np.arange(750) // 250)
        got.append(records.reshape(3, 250))
    for e in range(3):
        assert is_permutation(np.concatenate([g[e] for g in got]), n)


bounds = st.one_of(st.none(), st.integers(-80, 80))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 60),
    bounds,
    bounds,
    st.one_of(st.none(), st.integers(-10, 10).filter(bool)),
)
def test_slice_matches_python_slicing(n, start, stop, step):
    expected = list(range(n))[start:stop:step]
    plan = IndexPlan(n, [Slice(start, stop, step)])
    assert plan.length == len(expected)
    assert plan.lookup(np.arange(plan.length))[0].tolist() == expected


def test_slice_then_shuffle_then_repeat():
    plan = IndexPlan(100, [Slice(10, 90, 2), Shuffle(5), Repeat(2)])
    records, _ = plan.lookup(np.arange(80))
    assert sorted(records[:40].tolist()) == list(range(10, 90, 2))
    assert sorted(records[40:].tolist()) == list(range(10, 90, 2))


@pytest.mark.parametrize(
    ("ops", "match"),
    [
        ([Repeat(None), Shuffle(1)], "finite parent"),
        ([Repeat(None), Slice(0, None)], "finite parent"),
        ([Repeat(None), Slice(-10, 5)], "finite parent"),
        ([Repeat(None), Slice(5, 0, -1)], "finite parent"),
        ([Repeat(None), Shard(0, 2, contiguous=True)], "finite parent"),
        ([Repeat(None), Repeat(2)], "finite parent"),
        ([Slice(0, 10), BlockShuffle(1, 2)], "must come first"),
        ([Shuffle(2), BlockShuffle(1, 2)], "must come first"),
        ([Shard(0, 2), BlockShuffle(1, 2)], "must come first"),
    ],
)
def test_invalid_chains_raise(ops, match):
    with pytest.raises(ValueError, match=match):
        IndexPlan(100, ops, chunk_starts=np.array([0, 50, 100]))


def test_invalid_ops_and_inputs_raise():
    assert IndexPlan(0, [Repeat(2)]).length == IndexPlan(0, [Repeat()]).length == 0  # Grain's
    with pytest.raises(ValueError, match="chunk_starts"):
        IndexPlan(100, [BlockShuffle(1, 2)])
    with pytest.raises(ValueError, match="ends at"):
        IndexPlan(100, [], chunk_starts=np.array([0, 99]))
    with pytest.raises(ValueError):
        Slice(0, 10, 0)
    with pytest.raises(ValueError):
        Shard(2, 2)
    with pytest.raises(ValueError):
        Shard(-1, 2)
    with pytest.raises(ValueError):
        Shard(0, 0)
    with pytest.raises(ValueError):
        Shuffle(1, "bogus")
    with pytest.raises(ValueError):
        Shuffle(1, "block", block_bytes=-1)
    with pytest.raises(ValueError):
        Shuffle(1, "exact", window_bytes=4)
    with pytest.raises(ValueError, match="resolved"):
        IndexPlan(100, [Shuffle(1, "block")], chunk_starts=np.array([0, 50, 100]))
    with pytest.raises(ValueError):
        BlockShuffle(1, -1)
    with pytest.raises(ValueError):
        Repeat(-1)
    with pytest.raises(TypeError):
        Shard(0.5, 2)
    plan = IndexPlan(10, [Shuffle(1)])
    for bad in ([10], [-1]):
        with pytest.raises(IndexError):
            plan.lookup(np.array(bad))


def test_epoch_length():
    assert IndexPlan(100, [Shuffle(1)]).epoch_length == 100
    assert IndexPlan(100, [Repeat(None)]).epoch_length == 100
    assert IndexPlan(100, [Repeat(None), Shard(1, 4)]).epoch_length == 25
    assert IndexPlan(100, [Repeat(None), Shard(1, 3)]).epoch_length is None  # uneven
    assert IndexPlan(100, [Repeat(3), Shuffle(1)]).epoch_length is None  # mixes epochs
    assert IndexPlan(100, [Repeat(3), Shard(0, 3, contiguous=True)]).epoch_length == 100
    assert IndexPlan(100, [Repeat(3), Shard(1, 2, contiguous=True)]).epoch_length is None
    assert IndexPlan(100, [Repeat(3), Slice(200, None, 5)]).epoch_length == 20
    assert IndexPlan(100, [Repeat(3), Slice(10, None)]).epoch_length is None
    # Whenever it is defined, epoch(p) - epoch(0) == p // epoch_length.
    for ops in ([Repeat(4), Shard(1, 4)], [Repeat(4), Slice(100, 390, 5), Shard(0, 2)]):
        plan = IndexPlan(100, ops)
        _, ep = plan.lookup(np.arange(plan.length))
        assert np.array_equal(ep - ep[0], np.arange(plan.length) // plan.epoch_length)


def test_ops_and_plans_pickle():
    starts = np.array([0, 40, 100])
    plan = IndexPlan(100, [BlockShuffle(1, 1), Repeat(None), Shard(0, 2)], starts)
    again = pickle.loads(pickle.dumps(plan))
    p = np.arange(0, 10**4, 97)
    assert all(np.array_equal(a, b) for a, b in zip(plan.lookup(p), again.lookup(p)))
    assert pickle.loads(pickle.dumps(Shard(1, 3))) == Shard(1, 3)


# ----------------------------------------------------------------------------- statistics


def test_exact_shuffle_is_not_trivially_biased():
    n = 1000
    # The first element over 2000 epochs' keys is spread over [0, n).
    firsts = np.array([feistel_permute(np.array([0]), n, epoch_key(7, e))[0] for e in range(2000)])
    hist = np.bincount(firsts // 100, minlength=10)  # expected 200 per bin, sd ~13
    assert hist.min() > 120 and hist.max() < 280
    assert len(np.unique(firsts)) > 750  # ~865 expected for uniform draws
    # Displacement and rank correlation look like those of a random permutation.
    disp, corr, adjacent = [], [], []
    for e in range(20):
        perm = feistel_permute(np.arange(n), n, epoch_key(7, e))
        disp.append(np.abs(perm - np.arange(n)).mean())  # ~n/3 for a random permutation
        corr.append(np.corrcoef(np.arange(n), perm)[0, 1])
        adjacent.append(np.mean(np.abs(np.diff(perm)) == 1))
    assert 280 < np.mean(disp) < 390
    assert np.max(np.abs(corr)) < 0.15
    assert np.mean(adjacent) < 0.01


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 500), st.integers(1, 5), st.integers(1, 9), st.booleans())
def test_block_shards_deal_whole_blocks_and_cover(n, count, block, drop):
    """Shards dealt in blocks: disjoint, cover (unless drop), and round r of every shard is
    the r-th run of block*count parent positions."""
    seen = []
    for index in range(count):
        plan = IndexPlan(n, [Shard(index, count, block=block, drop_remainder=drop)])
        got = plan.lookup(np.arange(plan.length or 0))[0].tolist() if plan.length else []
        for p, g in enumerate(got):
            assert g == (p // block) * block * count + index * block + p % block
        seen.append(got)
    flat = sorted(x for s in seen for x in s)
    assert len(flat) == len(set(flat))
    if drop:
        assert len({len(s) for s in seen}) == 1
        assert flat == list(range((n // (block * count)) * block * count))
    else:
        assert flat == list(range(n))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.integers(0, 300), st.integers(0, 300), st.integers(1, 7))
def test_a_slice_of_an_infinite_repeat_is_the_slice_of_enough_epochs(n, a, b, step):
    """`repeat()[a:b:c]` is `repeat(k)[a:b:c]` for any k covering b (issue 16 item 6)."""
    epochs = b // n + 1
    endless = IndexPlan(n, [Shuffle(seed=3), Repeat(None), Slice(a, b, step)])
    finite = IndexPlan(n, [Shuffle(seed=3), Repeat(epochs), Slice(a, b, step)])
    assert endless.length == finite.length == len(range(a, max(a, b), step))
    pos = np.arange(finite.length)
    for got, want in zip(endless.lookup(pos), finite.lookup(pos), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("ops", [
    [Shard(2, 3), Repeat(None)],
    [Shard(2, 3), Shuffle(4), Repeat(None)],
    [Shard(2, 3, contiguous=True), Repeat(None)],
])
def test_an_empty_shard_of_records_repeated_forever_is_refused(ops):
    """Shard 2 of 3 over 2 records holds none: repeated forever it would end at once while
    its siblings never do (on several hosts, a training loop that hangs in its first
    collective), so it is an error naming the shard and the records."""
    with pytest.raises(ValueError, match=r"shard\(2/3\).*2 records"):
        IndexPlan(2, ops)


def test_empty_shards_that_agree_are_allowed():
    # drop_remainder gives every shard none: all end together, as an empty dataset does
    assert IndexPlan(2, [Shard(2, 3, drop_remainder=True), Repeat(None)]).length == 0
    assert IndexPlan(0, [Shard(2, 3), Repeat(None)]).length == 0
    assert IndexPlan(2, [Shard(2, 3), Repeat(2)]).length == 0  # finite: ends as its epochs do
    assert IndexPlan(2, [Shard(1, 3), Repeat(None)]).length is None
