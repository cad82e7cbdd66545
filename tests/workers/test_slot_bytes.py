"""`slot_bytes`, the parent's estimate of what a batch takes in a slot: a column of strings
or bytes is counted in C loops, and must come to what counting each element gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from aioloader.workers.arena import slot_bytes


def one_by_one(x: object) -> int:
    """The estimate's definition, element by element."""
    if isinstance(x, dict):
        return sum(one_by_one(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        if x and isinstance(x[0], (int, float)):
            return 9 * len(x)
        return sum(one_by_one(v) for v in x)
    if isinstance(x, np.ndarray):
        return slot_bytes(x)
    if isinstance(x, bytes):
        return len(x) + 8
    if isinstance(x, str):
        return (len(x) if x.isascii() else 4 * len(x)) + 8
    return 8


scalars = st.one_of(st.text(max_size=20), st.binary(max_size=20), st.none(),
                    st.text(alphabet="abc", max_size=5))
columns = st.one_of(st.lists(st.text(max_size=30), max_size=40),
                    st.lists(st.binary(max_size=30), max_size=40),
                    st.lists(scalars, max_size=40),
                    st.lists(scalars, max_size=10).map(tuple))


@given(st.dictionaries(st.text(max_size=3), columns, max_size=4))
def test_a_column_of_strings_counts_as_its_elements_do(batch: dict) -> None:
    assert slot_bytes(batch) == one_by_one(batch)


def test_wide_characters_count_four_bytes_each_and_a_str_subclass_counts_alone() -> None:
    class Name(str):
        pass

    column = ["ab", "é", "", "日本", Name("xyz")]
    assert slot_bytes(column) == (2 + 8) + (4 + 8) + 8 + (8 + 8) + (3 + 8)
    assert slot_bytes(column[:4]) == (2 + 8) + (4 + 8) + 8 + (8 + 8)
    assert slot_bytes([b"abc", b""]) == 11 + 8
