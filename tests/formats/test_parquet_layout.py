"""The index step of Parquet: the speculative tail and the longer footer, the row-group
layout the planner keeps (rows, fetch ranges, coalesced), and the page walk's thrift."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.formats.parquet import (
    TAIL_BYTES,
    coalesce,
    footer_from_tail,
    footer_range,
    tail_range,
)
from aioloader.formats.parquet.pages import PageError, walk_pages
from tests.support.parquet_files import (
    BINARY,
    I32,
    LIST,
    PATH,
    STRUCT,
    encode_struct,
    field,
    open_file,
    read_all,
    rewrite_footer,
    write,
)


def _table(n: int) -> pa.Table:
    return pa.table({"a": pa.array(np.arange(n)), "b": [f"b{j}" for j in range(n)],
                     "c": pa.array(np.arange(n) * 0.5)})


def test_a_small_file_is_read_whole_and_its_footer_cut_from_the_tail():
    data = write(_table(10))
    assert tail_range(len(data)) == (0, len(data))
    assert tail_range(1 << 30) == ((1 << 30) - TAIL_BYTES, TAIL_BYTES)
    footer = footer_from_tail(PATH, len(data), data, max_bytes=1 << 20)
    o, n = footer_range(PATH, len(data), data, max_bytes=1 << 20)
    assert footer == data[o:] and n == len(footer)


def test_a_footer_longer_than_the_tail_asks_for_its_range():
    data = write(_table(600), row_group_size=1)  # 600 row groups: a ~100 KB footer
    o, _n = tail_range(len(data))
    assert footer_from_tail(PATH, len(data), data[o:], max_bytes=1 << 30) is None
    fo, fn = footer_range(PATH, len(data), data[o:], max_bytes=1 << 30)
    assert fn > TAIL_BYTES and fo + fn == len(data)
    _meta, _layout, index = open_file(data)  # tail, then the footer's own range
    assert index.num_row_groups == 600 and index.num_rows == 600
    assert read_all(data, ["b"]).equals(pq.read_table(pa.BufferReader(data), columns=["b"]))


def test_the_index_keeps_rows_and_coalesced_ranges():
    data = write(_table(25), row_group_size=10, compression="none")
    meta, _layout, index = open_file(data)
    assert list(index.row_starts) == [0, 10, 20, 25]
    assert list(index.rows_per_group) == [10, 10, 5]
    for g in range(3):  # every column: the chunks touch, one range per row group
        (start, length), = index.fetch_ranges(g)
        rg = meta.row_group(g)
        assert start == min(rg.column(i).dictionary_page_offset or rg.column(i).data_page_offset
                            for i in range(3))
        assert length == sum(rg.column(i).total_compressed_size for i in range(3))
    _, _, ac = open_file(data, ["a", "c"])  # a gap where b lies: two ranges
    assert [len(ac.fetch_ranges(g)) for g in range(3)] == [2, 2, 2]
    group, within = index.locate([0, 9, 10, 24])
    assert group.tolist() == [0, 0, 1, 2] and within.tolist() == [0, 9, 0, 4]
    with pytest.raises(IndexError):
        index.locate([25])


def test_an_old_parquet_mr_files_chunks_are_padded_as_arrow_reads_them():
    """parquet-mr before 1.2.9 left a dictionary page's header out of the chunk's size;
    Arrow's reader reads 100 bytes more after such a chunk, so the fetch must hold them."""
    data = write(_table(30), row_group_size=10)
    old = rewrite_footer(data, lambda m: field(m, 6).__setitem__(
        2, b"parquet-mr version 1.2.8 (build abc)"))
    _, new_layout, _ = open_file(data)
    meta, layout, _index = open_file(old)
    assert meta.created_by.startswith("parquet-mr version 1.2.8")
    assert [c.length for c in layout.row_groups[0].chunks] == \
        [c.length + 100 for c in new_layout.row_groups[0].chunks]
    assert read_all(old).equals(pq.read_table(pa.BufferReader(old)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 50)), max_size=12))
def test_coalesce_joins_exactly_the_touching_ranges(ranges):
    out = coalesce(ranges)
    covered = {b for o, n in ranges for b in range(o, o + n)}
    assert {b for o, n in out for b in range(o, o + n)} == covered
    assert all(n > 0 for _, n in out)
    assert all(a[0] + a[1] < b[0] for a, b in itertools.pairwise(out))  # sorted, gaps between


def _page(num_values: int, decompressed: int = 10, compressed: int = 4,
          page_type: int = 0) -> bytes:
    header = [[1, I32, page_type], [2, I32, decompressed], [3, I32, compressed],
              [5 if page_type == 0 else 7, STRUCT, [[1, I32, num_values]]]]
    return encode_struct(header) + bytes(compressed)


def test_the_page_walk_adds_pages_up_to_the_chunks_values():
    chunk = _page(3, page_type=2) + _page(5) + _page(2, decompressed=7) + b"next chunk"
    totals = walk_pages(chunk, 7, max_decompressed=100)
    assert (totals.pages, totals.values, totals.decompressed) == (3, 7, 27)


@pytest.mark.parametrize(("chunk", "values", "words"), [
    (_page(5), 6, "end after 5 of the chunk's 6"),
    (_page(5) + _page(5), 7, "hold 10 values, the chunk declares 7"),
    (_page(5, compressed=4)[:-1], 5, "runs past"),
    (_page(5, decompressed=1 << 30), 5, "memory budget"),
    (_page(-1), 5, "negative"),
    (encode_struct([[1, I32, 0]]), 5, "lacks"),
    (b"\x1c" * 40, 1, "nests deeper"),
    (bytes([0x19, 0xF8]) + b"\xff\xff\xff\x0f", 1, "items in"),  # a list of 2^32 structs
    (encode_struct([[1, I32, 0], [9, BINARY, b"x" * 5]])[:6], 1, "runs past"),
    (bytes([LIST << 0 | 0x1D]), 1, "unknown thrift type 13"),
])
def test_a_lying_page_header(chunk, values, words):
    with pytest.raises(PageError, match=words):
        walk_pages(chunk, values, max_decompressed=1 << 20)
