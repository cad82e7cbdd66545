"""Tests of first-fit packing: no token lost or duplicated, layout, first fit, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.elements.packing import pack_first_fit

# --- stream generation --------------------------------------------------------------------

TRAILING = [(), (2,), (2, 3)]


@st.composite
def streams(draw):
    """(elements, length_struct, num_packing_bins). Every token is a distinct positive number,
    so any token in the output names the element (and position) it came from."""
    num_features = draw(st.integers(1, 3))
    names = [f"f{i}" for i in range(num_features)]
    targets = draw(st.lists(st.integers(8, 64), min_size=num_features, max_size=num_features))
    trailing = draw(
        st.lists(st.sampled_from(TRAILING), min_size=num_features, max_size=num_features)
    )
    num_bins = draw(st.integers(1, 6))
    length = st.one_of(st.just(0), st.integers(0, 40))
    shapes = draw(
        st.lists(st.lists(length, min_size=num_features, max_size=num_features), max_size=30)
    )
    counter = 1
    elements = []
    for lengths in shapes:
        element = {}
        for name, n, trail in zip(names, lengths, trailing):
            size = n * int(np.prod(trail, dtype=np.int64))
            element[name] = np.arange(counter, counter + size, dtype=np.int32).reshape(n, *trail)
            counter += size
        elements.append(element)
    return elements, dict(zip(names, targets)), num_bins


def drain(elements, length_struct, num_bins):
    """Pack a whole stream, feeding the entire remainder each call: [(start, batch, consumed)]."""
    out = []
    start = 0
    while True:
        batch, consumed = pack_first_fit(elements[start:], length_struct, num_bins, final=True)
        if batch is None:
            assert start + consumed == len(elements)
            return out
        assert consumed > 0
        out.append((start, batch, consumed))
        start += consumed
        if start == len(elements):
            return out


def drain_by_prefix(elements, length_struct, num_bins):
    """Pack a stream feeding only as many elements as needed: a growing prefix per batch."""
    out = []
    start = 0
    while start < len(elements):
        k = 1
        while True:
            final = start + k >= len(elements)
            batch, consumed = pack_first_fit(
                elements[start : start + k], length_struct, num_bins, final=final
            )
            if batch is not None or final:
                break
            assert consumed == 0
            k += 1
        if batch is None:  # only empty elements were left
            assert start + consumed == len(elements)
            break
        out.append((start, batch, consumed))
        start += consumed
    return out


def reference_first_fit(elements, length_struct, num_bins, final):
    """A deliberately naive packer, token by token, to compare the real one against."""
    names = list(length_struct)
    bins = [[] for _ in range(num_bins)]  # per bin: list of truncated elements
    for index, element in enumerate(elements):
        piece = {f: np.asarray(element[f])[: length_struct[f]] for f in names}
        if all(len(piece[f]) == 0 for f in names):
            continue
        for b in range(num_bins):
            if all(
                sum(len(e[f]) for e in bins[b]) + len(piece[f]) <= length_struct[f] for f in names
            ):
                bins[b].append(piece)
                break
        else:
            return _reference_layout(bins, elements, length_struct), index
    if not final:
        return None, 0
    if not any(bins):
        return None, len(elements)
    return _reference_layout(bins, elements, length_struct), len(elements)


def _reference_layout(bins, elements, length_struct):
    out = {}
    for f, target in length_struct.items():
        sample = np.asarray(elements[0][f])  # generated streams are uniform per feature
        data = np.zeros((len(bins), target, *sample.shape[1:]), sample.dtype)
        seg = np.zeros((len(bins), target), np.int32)
        pos = np.zeros((len(bins), target), np.int32)
        for b, members in enumerate(bins):
            t = 0
            for s, e in enumerate(members, start=1):
                for p in range(len(e[f])):
                    data[b, t] = e[f][p]
                    seg[b, t] = s
                    pos[b, t] = p
                    t += 1
        out[f] = data
        out[f + "_segment_ids"] = seg
        out[f + "_positions"] = pos
    return out


def assert_batches_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# --- properties ---------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(streams())
def test_every_token_lands_exactly_once_in_a_valid_layout(stream):
    elements, length_struct, num_bins = stream
    names = list(length_struct)
    # Tokens are unique, so the first token of any feature names its element.
    owner_of = {}
    for i, e in enumerate(elements):
        for f in names:
            if e[f].size:
                owner_of[e[f].reshape(len(e[f]), -1)[0, 0].item()] = i
    seen = []
    for start, batch, consumed in drain(elements, length_struct, num_bins):
        assert set(batch) == {f + s for f in names for s in ("", "_segment_ids", "_positions")}
        bin_members = [dict() for _ in range(num_bins)]  # per bin: segment id -> element index
        for f in names:
            target = length_struct[f]
            data, seg, pos = batch[f], batch[f + "_segment_ids"], batch[f + "_positions"]
            assert data.shape == (num_bins, target, *elements[0][f].shape[1:])
            assert data.dtype == elements[0][f].dtype
            assert seg.shape == pos.shape == (num_bins, target)
            assert seg.dtype == pos.dtype == np.int32
            for b in range(num_bins):
                used = int(np.count_nonzero(seg[b]))
                # Tokens fill a prefix of the bin; padding is zero everywhere.
                assert (seg[b, :used] > 0).all() and (seg[b, used:] == 0).all()
                assert (pos[b, used:] == 0).all() and (data[b, used:] == 0).all()
                # Segments are contiguous runs, in increasing id order, positions 0..n-1.
                assert (np.diff(seg[b, :used]) >= 0).all()
                for s in np.unique(seg[b, :used]):
                    (where,) = np.nonzero(seg[b] == s)
                    np.testing.assert_array_equal(pos[b, where], np.arange(len(where)))
                    tokens = data[b, where]
                    index = owner_of[tokens.reshape(len(where), -1)[0, 0].item()]
                    assert bin_members[b].setdefault(int(s), index) == index
                    expected = elements[index][f][:target]
                    np.testing.assert_array_equal(tokens, expected)
        for b in range(num_bins):
            # Segment ids are 1..k in placement (= stream) order, consumed from this batch.
            ids = sorted(bin_members[b])
            assert ids == list(range(1, len(ids) + 1))
            indices = [bin_members[b][s] for s in ids]
            assert indices == sorted(indices)
            assert all(start <= i < start + consumed for i in indices)
            seen.extend(indices)
            # Every feature of each placed element is there in full (empty ones included).
            for s, i in bin_members[b].items():
                for f in names:
                    n = min(len(elements[i][f]), length_struct[f])
                    assert np.count_nonzero(batch[f + "_segment_ids"][b] == s) == n
        if start + consumed < len(elements):
            # The batch closed because the next element fits in no bin.
            nxt = elements[start + consumed]
            for b in range(num_bins):
                assert any(
                    np.count_nonzero(batch[f + "_segment_ids"][b])
                    + min(len(nxt[f]), length_struct[f])
                    > length_struct[f]
                    for f in names
                )
    nonempty = [i for i, e in enumerate(elements) if any(len(e[f]) for f in names)]
    assert sorted(seen) == nonempty


@settings(max_examples=150, deadline=None)
@given(streams(), st.booleans())
def test_matches_naive_first_fit(stream, final):
    elements, length_struct, num_bins = stream
    start = 0
    while start <= len(elements):
        got, consumed = pack_first_fit(elements[start:], length_struct, num_bins, final=final)
        want, want_consumed = reference_first_fit(elements[start:], length_struct, num_bins, final)
        assert consumed == want_consumed
        assert (got is None) == (want is None)
        if got is None:
            break
        assert_batches_equal(got, want)
        start += consumed


@settings(max_examples=100, deadline=None)
@given(streams())
def test_deterministic_and_pure(stream):
    elements, length_struct, num_bins = stream
    copies = [{f: a.copy() for f, a in e.items()} for e in elements]
    first = pack_first_fit(elements, length_struct, num_bins, final=True)
    second = pack_first_fit(elements, length_struct, num_bins, final=True)
    assert first[1] == second[1]
    if first[0] is not None:
        assert_batches_equal(first[0], second[0])
        # The output owns its memory: scribbling on it leaves the inputs alone.
        for array in first[0].values():
            array[...] = 0
    for e, c in zip(elements, copies):
        for f in e:
            np.testing.assert_array_equal(e[f], c[f])


@settings(max_examples=100, deadline=None)
@given(streams(), st.data())
def test_resume_is_exact_however_the_caller_feeds_elements(stream, data):
    elements, length_struct, num_bins = stream
    whole = drain(elements, length_struct, num_bins)
    prefix = drain_by_prefix(elements, length_struct, num_bins)
    assert [(s, c) for s, _, c in whole] == [(s, c) for s, _, c in prefix]
    for (_, a, _), (_, b, _) in zip(whole, prefix):
        assert_batches_equal(a, b)
    # Restarting from a checkpoint (the start index of any batch) replays the rest exactly.
    if whole:
        k = data.draw(st.integers(0, len(whole) - 1))
        checkpoint = whole[k][0]
        resumed = drain(elements[checkpoint:], length_struct, num_bins)
        assert len(resumed) == len(whole) - k
        for (s, a, c), (rs, rb, rc) in zip(whole[k:], resumed):
            assert (rs + checkpoint, rc) == (s, c)
            assert_batches_equal(a, rb)


# --- hand-checked examples ----------------------------------------------------------------


def test_small_example_by_hand():
    elements = [
        {"tokens": np.array([1, 2, 3])},
        {"tokens": np.array([4, 5, 6, 7])},  # 3 + 4 > 6: opens bin 1
        {"tokens": np.array([], dtype=np.int64)},  # empty: consumed, no segment
        {"tokens": np.array([8, 9])},  # first fit: back to bin 0
        {"tokens": np.array([10])},  # bin 0 is now full (6)
        {"tokens": np.array([11, 12, 13])},  # fits nowhere: closes the batch
        {"tokens": np.array([14, 15, 16, 17, 18, 19, 20, 21])},  # truncated to 6
    ]
    batch, consumed = pack_first_fit(elements, {"tokens": 6}, 2)
    assert consumed == 5
    np.testing.assert_array_equal(batch["tokens"], [[1, 2, 3, 8, 9, 10], [4, 5, 6, 7, 0, 0]])
    np.testing.assert_array_equal(
        batch["tokens_segment_ids"], [[1, 1, 1, 2, 2, 3], [1, 1, 1, 1, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch["tokens_positions"], [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    )
    assert batch["tokens"].dtype == np.int64
    assert batch["tokens_segment_ids"].dtype == batch["tokens_positions"].dtype == np.int32

    rest = elements[consumed:]
    # Not the end of the stream and everything fits: undecided, nothing consumed.
    assert pack_first_fit(rest, {"tokens": 6}, 2) == (None, 0)
    batch, consumed = pack_first_fit(rest, {"tokens": 6}, 2, final=True)
    assert consumed == 2
    np.testing.assert_array_equal(
        batch["tokens"], [[11, 12, 13, 0, 0, 0], [14, 15, 16, 17, 18, 19]]
    )
    np.testing.assert_array_equal(
        batch["tokens_segment_ids"], [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]
    )
    np.testing.assert_array_equal(
        batch["tokens_positions"], [[0, 1, 2, 0, 0, 0], [0, 1, 2, 3, 4, 5]]
    )


def test_multi_feature_example_with_trailing_dims():
    def elem(n_in, n_tgt, base):
        inputs = (base + np.arange(n_in * 2, dtype=np.float32)).reshape(n_in, 2)
        return {"inputs": inputs, "targets": np.arange(base, base + n_tgt, dtype=np.int32)}

    elements = [
        elem(3, 2, 10),  # bin 0, segment 1
        elem(2, 2, 20),  # targets 2 + 2 > 3: bin 1, segment 1
        elem(2, 1, 30),  # inputs 3 + 2 <= 5, targets 2 + 1 <= 3: bin 0, segment 2
        elem(1, 0, 40),  # inputs 5 + 1 > 5 in bin 0; bin 1, segment 2, no target tokens
        elem(4, 1, 50),  # inputs fit nowhere (bin 0: 5 + 4, bin 1: 3 + 4): batch done
    ]
    batch, consumed = pack_first_fit(elements, {"inputs": 5, "targets": 3}, 2)
    assert consumed == 4
    assert batch["inputs"].shape == (2, 5, 2) and batch["inputs"].dtype == np.float32
    assert batch["targets"].shape == (2, 3) and batch["targets"].dtype == np.int32
    np.testing.assert_array_equal(
        batch["inputs"],
        [
            [[10, 11], [12, 13], [14, 15], [30, 31], [32, 33]],
            [[20, 21], [22, 23], [40, 41], [0, 0], [0, 0]],
        ],
    )
    np.testing.assert_array_equal(batch["inputs_segment_ids"], [[1, 1, 1, 2, 2], [1, 1, 2, 0, 0]])
    np.testing.assert_array_equal(batch["inputs_positions"], [[0, 1, 2, 0, 1], [0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(batch["targets"], [[10, 11, 30], [20, 21, 0]])
    np.testing.assert_array_equal(batch["targets_segment_ids"], [[1, 1, 2], [1, 1, 0]])
    np.testing.assert_array_equal(batch["targets_positions"], [[0, 1, 0], [0, 1, 0]])


# --- edges and validation -----------------------------------------------------------------


def test_edges_of_the_stream():
    ls = {"x": 4}
    assert pack_first_fit([], ls, 2) == (None, 0)
    assert pack_first_fit([], ls, 2, final=True) == (None, 0)
    empties = [{"x": np.zeros(0, np.int32)}] * 3
    assert pack_first_fit(empties, ls, 2) == (None, 0)
    # At the end of the stream, trailing empty elements are consumed with nothing to emit.
    assert pack_first_fit(empties, ls, 2, final=True) == (None, 3)


def test_empty_pieces_are_exempt_from_dtype_and_shape_checks():
    ls = {"a": 4, "b": 4}
    elements = [
        {"a": np.array([1, 2], np.int32), "b": np.array([])},  # float64, shape (0,)
        {"a": np.array([3], np.int32), "b": np.ones((2, 3), np.int16)},
    ]
    batch, consumed = pack_first_fit(elements, ls, 1, final=True)
    assert consumed == 2
    assert batch["b"].dtype == np.int16 and batch["b"].shape == (1, 4, 3)
    np.testing.assert_array_equal(batch["b_segment_ids"], [[2, 2, 0, 0]])
    # A feature empty in every placed element takes its dtype/shape from the first one.
    batch, _ = pack_first_fit(
        [{"a": np.array([1]), "b": np.zeros((0, 5), np.uint8)}], ls, 1, final=True
    )
    assert batch["b"].dtype == np.uint8 and batch["b"].shape == (1, 4, 5)
    assert not batch["b"].any()


@pytest.mark.parametrize(
    ("elements", "length_struct", "bins", "error", "match"),
    [
        ([{"x": np.arange(2), "extra": np.arange(2)}], {"x": 4}, 1, ValueError, "'extra'"),
        ([{"x": np.arange(2)}], {"x": 4, "y": 4}, 1, ValueError, "'y'"),
        ([{"x": np.arange(2)}], {"x": 4}, 0, ValueError, "num_packing_bins"),
        ([{"x": np.arange(2)}], {"x": 0}, 1, ValueError, r"length_struct\['x'\]"),
        ([{"x": np.arange(2)}], {}, 1, ValueError, "at least one"),
        ([{"x": np.arange(2)}], {"x": 4}, 1.5, TypeError, "num_packing_bins"),
        ([{"x": np.int32(3)}], {"x": 4}, 1, ValueError, "scalar"),
        (
            [{"x": np.zeros((1, 2))}, {"x": np.zeros((1, 3))}],
            {"x": 4},
            1,
            ValueError,
            "trailing shape",
        ),
        (
            [{"x": np.zeros(1, np.int32)}, {"x": np.zeros(1, np.int64)}],
            {"x": 4},
            1,
            ValueError,
            "dtype",
        ),
    ],
)
def test_invalid_input_is_rejected(elements, length_struct, bins, error, match):
    with pytest.raises(error, match=match):
        pack_first_fit(elements, length_struct, bins, final=True)
