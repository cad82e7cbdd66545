"""Damaged Parquet bytes, at random: the page walk and the whole read raise only
`PageError` / `ParquetFormatError` (or read the declared rows), never anything else."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.formats.parquet import ParquetFormatError
from aioloader.formats.parquet.pages import PageError, walk_pages
from tests.support.parquet_files import (
    I32,
    I64,
    STRUCT,
    encode_struct,
    open_file,
    read_all,
    write,
)

GOOD = {codec: write(pa.table({"i": pa.array(np.arange(40) % 7),
                               "s": [f"v{j % 5}" * (j % 4) for j in range(40)],
                               "l": [[j] * (j % 3) for j in range(40)]}),
                     row_group_size=16, compression=codec)
        for codec in ("none", "snappy", "zstd")}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 50))
def test_the_page_walk_raises_only_page_errors(data, values):
    try:
        totals = walk_pages(data, values, max_decompressed=1 << 20)
    except PageError:
        return
    assert totals.values == values and totals.decompressed <= 1 << 20


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 4), st.sampled_from([0, 2, 3]),
                          st.integers(0, 1000)), min_size=1, max_size=6)
       .filter(lambda pages: pages[-1][2] != 2))
def test_the_page_walk_adds_what_the_headers_say(pages):
    """Headers with statistics and other fields the walk skips, as writers add them; the
    last page holds data (the walk ends with the data page that completes the values)."""
    chunk, want_values, want_size = b"", 0, 0
    for values, body, kind, size in pages:
        stats = [[1, 8, b"max"], [2, 8, b"min"], [3, I64, 2]]
        sub = [[1, I32, values], [2, I32, 0]] + ([[5, STRUCT, stats]] if kind == 0 else [])
        which = {0: 5, 2: 7, 3: 8}[kind]
        chunk += encode_struct([[1, I32, kind], [2, I32, size], [3, I32, body],
                                [which, STRUCT, sub]]) + bytes(body)
        if kind != 2:
            want_values += values
        want_size += size
    totals = walk_pages(chunk, want_values, max_decompressed=1 << 30)
    assert (totals.pages, totals.values, totals.decompressed) == \
        (len(pages), want_values, want_size)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(GOOD)), st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)),
                                               min_size=1, max_size=4))
def test_damaged_files_raise_only_format_errors(codec, flips):
    data = bytearray(GOOD[codec])
    for where, xor in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= xor
    try:
        table = read_all(bytes(data), max_bytes=64 << 20, max_rows=1 << 16)
    except ParquetFormatError:
        return
    assert table.num_rows == open_file(bytes(data))[2].num_rows
