"""batch(pad=...): what ragged leaves become (pure): padded data, masks, and the errors that
name the argument, the field and the element."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.elements.collate import CollateError, collate, collate_named
from aioloader.elements.padding import pad_rules

ragged = st.lists(st.lists(st.integers(-100, 100), max_size=12), min_size=1, max_size=10)


def _elements(rows, trailing=()):
    return [{"id": np.int64(i), "tokens": np.asarray(r, np.int16).reshape(-1, *trailing)
             if not trailing else np.repeat(np.asarray(r, np.int16)[:, None], trailing[0], 1)}
            for i, r in enumerate(rows)]


@given(ragged, st.integers(-5, 5))
def test_padding_to_the_longest_keeps_every_value_and_marks_it(rows, value):
    got = collate(_elements(rows), pad=pad_rules(True, value))
    longest = max(map(len, rows))
    assert got["tokens"].shape == (len(rows), longest) and got["tokens"].dtype == np.int16
    assert got["tokens_mask"].dtype == bool
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(got["tokens"][i, : len(r)], r)
        assert (got["tokens"][i, len(r):] == value).all()
        assert got["tokens_mask"][i].tolist() == [j < len(r) for j in range(longest)]
    np.testing.assert_array_equal(got["id"], np.arange(len(rows)))  # scalars as before


@given(ragged, st.integers(1, 15))
def test_a_fixed_length_with_truncate_cuts_and_pads_to_exactly_it(rows, length):
    got = collate(_elements(rows), pad=pad_rules({"tokens": length}, truncate=True))
    assert got["tokens"].shape == (len(rows), length)
    for i, r in enumerate(rows):
        kept = min(len(r), length)
        np.testing.assert_array_equal(got["tokens"][i, :kept], r[:kept])
        assert not got["tokens"][i, kept:].any()
        assert got["tokens_mask"][i].sum() == kept


@given(ragged, st.integers(1, 15))
def test_longer_than_a_fixed_length_is_refused_naming_field_and_element(rows, length):
    too_long = [i for i, r in enumerate(rows) if len(r) > length]
    if not too_long:
        assert collate(_elements(rows), pad=pad_rules({"tokens": length}))["tokens"].shape == \
            (len(rows), length)
        return
    worst = max(range(len(rows)), key=lambda i: (len(rows[i]), -i))
    with pytest.raises(CollateError, match=rf"element\['tokens'\] to {length}, but element "
                                           rf"{worst} has") as e:
        collate(_elements(rows), pad=pad_rules({"tokens": length}))
    assert e.value.element == worst


@given(st.integers(1, 8), st.integers(0, 6))
def test_equal_lengths_stack_as_before_with_a_full_mask(n, length):
    rows = [list(range(length))] * n
    plain = collate(_elements(rows))
    got = collate(_elements(rows), pad=pad_rules(True))
    np.testing.assert_array_equal(got["tokens"], plain["tokens"])
    assert got["tokens_mask"].shape == (n, length) and got["tokens_mask"].all()


@given(ragged)
def test_trailing_axes_are_kept_and_an_allocator_receives_the_arrays(rows):
    handed = []

    def alloc(shape, dtype):
        handed.append(np.zeros(shape, dtype))
        return handed[-1]

    got = collate(_elements(rows, trailing=(3,)), pad=pad_rules(True), alloc=alloc)
    assert got["tokens"].shape == (len(rows), max(map(len, rows)), 3)
    assert {id(got["tokens"]), id(got["tokens_mask"])} <= {id(a) for a in handed}
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(got["tokens"][i, : len(r), 2], r)


def test_per_field_lengths_and_values_in_nested_and_tuple_elements():
    els = [{"a": {"x": np.arange(n, dtype=np.float32), "y": np.ones(n % 3 + 1)},
            "b": (np.full(n, 7), np.int32(n))} for n in (1, 3)]
    got = collate(els, pad=pad_rules({"a": {"x": 4, "y": True}, "b": True},
                                     {"a": {"x": np.nan}, "b": (-1,)}), masks=False)
    assert got["a"]["x"].shape == (2, 4) and np.isnan(got["a"]["x"][0, 1:]).all()
    assert got["a"]["y"].tolist() == [[1, 1], [1, 0]]
    assert got["b"][0].tolist() == [[7, -1, -1], [7, 7, 7]] and got["b"][1].tolist() == [1, 3]
    assert set(got) == {"a", "b"}
    with_masks = collate([{"a": e["a"]} for e in els], pad=pad_rules({"a": True}))
    assert set(with_masks["a"]) == {"x", "x_mask", "y", "y_mask"}


def test_fields_not_named_are_stacked_as_before():
    els = [{"tokens": np.arange(n), "other": np.arange(n)} for n in (1, 2)]
    with pytest.raises(CollateError, match=r"element\['other'\] to have one shape"):
        collate(els, pad=pad_rules({"tokens": True}))


@pytest.mark.parametrize("els, rules, masks, match", [
    ([(np.arange(1),), (np.arange(2),)], (True,), True, r"element\[0\], which is not a field"),
    ([{"t": np.arange(1), "t_mask": 1}] * 2, {"t": True}, True, r"'t_mask', which the element"),
    ([{"t": np.arange(1)}] * 2, {"u": True}, True, r"names element\['u'\], which element 0"),
    ([{"t": np.arange(1, dtype=np.uint8)}] * 2, ({"t": True}, -1), True, "uint8 cannot hold"),
    ([{"t": np.ones((1, 2))}, {"t": np.ones((2, 3))}], {"t": True}, True, r"trailing shape"),
    ([{"t": np.array(["a"])}] * 2, {"t": True}, True, "pads numbers"),
])
def test_what_cannot_be_padded_is_explained(els, rules, masks, match):
    pad, value = rules if isinstance(rules, tuple) and len(rules) == 2 and \
        not isinstance(rules[0], bool) else (rules, 0)
    with pytest.raises(CollateError, match=match):
        collate(els, pad=pad_rules(pad, value), masks=masks)


def test_the_record_is_named():
    els = [{"t": np.arange(n)} for n in (1, 9)]
    with pytest.raises(CollateError, match=r"element 1 has 9.*\[element 1 is record 41\]"):
        collate_named(els, lambda k: f"record {40 + k}", pad=pad_rules({"t": 4}))


@pytest.mark.parametrize("kw, error, match", [
    ({"pad": 0}, ValueError, r"batch\(\) pad = 0 is not a length"),
    ({"pad": {"t": -3}}, ValueError, r"pad\['t'\] = -3 is not a length"),
    ({"pad": "yes"}, TypeError, r"batch\(\) pad must be True"),
    ({"pad": {"t": 1.5}}, TypeError, r"pad\['t'\] must be True"),
    ({"pad": True, "truncate": True}, ValueError, r"truncate=True.*pad= gives none"),
    ({"pad": {"t": True}, "pad_value": {"u": 1}}, ValueError, r"pad_value\['u'\] is given"),
    ({"pad_value": 1.0, "pad": None}, ValueError, r"pad_value=1.0 is given, but pad= pads"),
    ({"pad": np.True_, "pad_value": 0.0}, None, None),
    ({"pad": None, "pad_value": {"u": 1}}, ValueError, r"pad_value is given, but pad pads"),
    ({"pad": {"t": True}, "pad_value": {"t": "x"}}, TypeError, r"pad_value for pad\['t'\]"),
    ({"pad": True, "masks": "no"}, TypeError, "batch masks must be True or False"),
    ({"pad": {"t": True, "u": False}, "pad_value": {"u": -1}}, ValueError,
     r"pad_value\['u'\] = -1 is given, but pad\['u'\] is False"),
    (({"pad": (True, None), "pad_value": (0, 7)}), ValueError, r"pad_value\[1\] = 7 is given"),
    ({"pad": {"t": True, "u": False}, "pad_value": {"t": 1, "u": 0}}, None, None),
])
def test_bad_arguments_are_refused_by_the_verb_naming_them(kw, error, match):
    ds = al.Dataset.from_source([b"x"])
    if error is None:
        ds.batch(2, **kw)
        return
    with pytest.raises(error, match=match):
        ds.batch(2, **kw)


def test_pad_after_pack_is_refused():
    ds = al.Dataset.from_source([b"x"]).pack({"t": 4}, num_packing_bins=2)
    with pytest.raises(ValueError, match=r"batch\(pad=\) after pack\(\)"):
        ds.batch(2, pad=True)


def test_the_description_shows_the_padding():
    ds = al.Dataset.from_source([b"x"])
    assert ds.batch(4).describe()[-1] == "batch(4)"
    assert ds.batch(4, pad={"t": 8}, pad_value=-1, truncate=True).describe()[-1] == \
        "batch(4, pad={'t': 8}, pad_value=-1, truncate)"


@pytest.mark.parametrize("dtype, value", [
    (np.float16, 1e5),  # would be inf
    (np.float16, 1e-9),  # would be 0
    (np.float32, 16777217),  # would be 16777216
    (np.float32, 16777217.0),
    (np.int32, 0.5),
    (np.int8, 300),
    (np.uint8, -1),
    (np.int64, 2**70),
    (np.bool_, 2),
])
def test_a_pad_value_the_dtype_cannot_hold_is_refused(dtype, value):
    els = [{"t": np.zeros(n, dtype)} for n in (1, 3)]
    with pytest.raises(CollateError, match=rf"element\['t'\] \({np.dtype(dtype)}\) with "
                                           rf"pad_value={value!r}.*cannot hold"):
        collate(els, pad=pad_rules({"t": True}, {"t": value}))


@pytest.mark.parametrize("dtype, value, want", [
    (np.float16, 65504.0, 65504.0), (np.float32, 16777216, 16777216.0),
    (np.float32, 0.1, np.float32(0.1)), (np.float16, -0.5, -0.5),
    (np.float32, float("nan"), np.nan), (np.float32, float("-inf"), -np.inf),
    (np.int8, -128, -128), (np.uint8, True, 1), (np.bool_, 1, True), (np.float64, 1e-300, 1e-300),
])
def test_a_pad_value_the_dtype_holds_pads(dtype, value, want):
    got = collate([{"t": np.zeros(n, dtype)} for n in (1, 3)],
                  pad=pad_rules({"t": True}, {"t": value}))
    assert got["t"].dtype == dtype
    np.testing.assert_array_equal(got["t"][0, 1:], np.array([want, want], dtype))


def test_bucket_by_length_errors_name_it():
    els = [{"t": np.zeros(n, np.uint8), "u": np.zeros(n)} for n in (1, 3)]
    with pytest.raises(CollateError, match=r"^bucket_by_length\(pad=\) pads element\['t'\] "):
        collate(els, pad=pad_rules({"t": True}, -1), verb="bucket_by_length")
    with pytest.raises(CollateError, match=r"^bucket_by_length\(\) needs element\['u'\] to "
                                           r"have one shape.*before bucket_by_length\(\)"):
        collate(els, pad=pad_rules({"t": True}), verb="bucket_by_length")
