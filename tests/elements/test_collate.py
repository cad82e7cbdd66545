"""collate: what a batch of elements becomes (pure), with and without a slot allocator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioloader.elements.collate import CollateError, collate

numbers = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=40),
    st.lists(st.floats(allow_nan=False), min_size=1, max_size=40),
    st.lists(st.booleans(), min_size=1, max_size=40),
    st.lists(st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6), st.booleans()),
             min_size=1, max_size=40),
)


@given(numbers)
def test_python_numbers_stack_like_numpy(values):
    got = collate(values)
    want = np.stack([np.asarray(v) for v in values])
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@given(numbers)
def test_an_allocator_receives_the_stacked_arrays(values):
    buf = bytearray(1 << 12)
    handed = []
    pos = [0]

    def alloc(shape, dtype):
        a = np.ndarray(shape, dtype=dtype, buffer=buf, offset=pos[0])
        pos[0] += (a.nbytes + 63) // 64 * 64
        handed.append(a)
        return a

    got = collate([{"x": v, "y": np.full(3, v)} for v in values], alloc=alloc)
    assert [id(a) for a in handed] == [id(got["x"]), id(got["y"])]
    np.testing.assert_array_equal(got["x"], np.stack([np.asarray(v) for v in values]))
    np.testing.assert_array_equal(got["y"], np.stack([np.full(3, v) for v in values]))


def test_an_allocator_may_decline():
    got = collate([np.ones(2), np.zeros(2)], alloc=lambda shape, dtype: None)
    np.testing.assert_array_equal(got, [[1, 1], [0, 0]])


def test_text_stays_a_list_and_mixed_shapes_are_explained():
    assert collate([b"a", memoryview(b"b")]) == [b"a", b"b"]
    with pytest.raises(ValueError, match=r"one shape, got \[\(\), \(1,\)\]"):
        collate([1, [2]])


def test_a_missing_key_names_the_field_and_the_element():
    with pytest.raises(CollateError, match=r"same keys: element 2 .*missing \[\"'y'\"\]") as e:
        collate([{"x": 1, "y": 2}, {"x": 3, "y": 4}, {"x": 5}])
    assert e.value.element == 2


def test_numbers_mixed_with_strings_are_refused_not_turned_into_text():
    for values in ([1, 2, "3"], [1.5, "x"], [np.int64(1), "a"]):
        with pytest.raises(CollateError, match=r"element\['n'\] of mixed types") as e:
            collate([{"n": v} for v in values])
        assert e.value.element == len(values) - 1


def test_a_dict_mixed_with_another_type_is_named():
    with pytest.raises(CollateError, match=r"element 0 is dict, element 1 is list"):
        collate([{"x": 1}, [1]])
    with pytest.raises(CollateError, match=r"element\[0\] to have the same length"):
        collate([((1, 2),), ((1, 2, 3),)])


def test_an_extra_key_is_named_not_silently_dropped():
    with pytest.raises(CollateError, match=r"element 1 differs .*missing \[\], extra \[\"'z'\"\]"):
        collate([{"x": 1}, {"x": 2, "z": 3}])
