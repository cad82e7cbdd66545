"""The longest entry of a PLAIN dictionary page (`formats.parquet.budget`), which bounds what
dictionary-encoded strings may decode to: the walk over the entries' length prefixes gives
the longest length, and an entry that runs past the page is an error, never a bound."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioloader.formats.parquet.budget import _longest_entry
from aioloader.formats.parquet.pages import PageError


def _page(lengths: list[int]) -> bytes:
    return b"".join(struct.pack("<I", n) + b"x" * n for n in lengths)


@given(st.lists(st.integers(0, 3000), max_size=60))
def test_the_walk_gives_the_longest_entry(lengths):
    page = _page(lengths)
    assert _longest_entry(memoryview(page), "UNCOMPRESSED", len(page), 0) == max(lengths,
                                                                                  default=0)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=30), st.integers(1, 299))
def test_a_page_cut_inside_an_entry_is_an_error(lengths, cut):
    page = _page(lengths)
    short = page[: max(0, len(page) - cut)]
    bounds = {0}
    at = 0
    for n in lengths:  # (where entries end: a cut there is a whole page of fewer entries)
        at += 4 + n
        bounds.add(at)
    if len(short) in bounds:
        return
    with pytest.raises(PageError, match="run past its end"):
        _longest_entry(memoryview(short), "UNCOMPRESSED", len(short), 0)
