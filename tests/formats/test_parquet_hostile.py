"""Parquet files that lie: each is refused with a `ParquetFormatError` naming the file (and
the row group and column where there is one) before anything is allocated for the lie; and
a child process reading all of them under an address-space limit stays small."""

from __future__ import annotations

import contextlib
import json
import pickle
import resource
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aioloader import ParquetFormatError
from aioloader.formats.parquet import (
    RowGroupDecoder,
    decode_row_group,
    footer_range,
    parse_footer,
    tail_range,
)
from tests.support.parquet_files import (
    I64,
    PATH,
    STRUCT,
    _varint,
    column_meta,
    encode_struct,
    fetch,
    field,
    open_file,
    page_header,
    read_all,
    rewrite_footer,
    row_groups,
    write,
)

ROWS = 30


def _good(**kw) -> bytes:
    table = pa.table({"i": pa.array(np.arange(ROWS)), "s": [f"text {j}" for j in range(ROWS)],
                      "l": [[j, j] for j in range(ROWS)]})
    return write(table, row_group_size=10, **kw)


def _set(fid: int, value: int, group: int = 1, column: int = 0):
    def edit(meta):
        field(column_meta(meta, group, column), fid)[2] = value
    return edit


def _rows(group: int, value: int, total: int | None = None):
    def edit(meta):
        field(row_groups(meta)[group], 3)[2] = value
        if total is not None:
            field(meta, 3)[2] = total
    return edit


def _lying_page(data: bytes, size: int = 2**31 - 1) -> bytes:
    """The last row group's last chunk's first page claims `size` decompressed bytes: the
    chunk (the last bytes before the page index and footer) grows with its header, and its
    declared size with it."""
    _meta, layout, _index = open_file(data)
    chunk = layout.row_groups[-1].chunks[-1]
    header, body = page_header(data, chunk.offset)
    field(header, 2)[2] = size
    new = encode_struct(header)
    grown = len(new) - (body - chunk.offset)
    data = data[:chunk.offset] + new + data[body:]

    def edit(m):
        cm = column_meta(m, len(layout.row_groups) - 1, chunk.leaf)
        field(cm, 7)[2] += grown
        for rg in row_groups(m):  # the page indexes after the data moved with it
            for cc in field(rg, 1)[2][1]:
                for fid in (4, 6):  # offset_index_offset, column_index_offset
                    with contextlib.suppress(KeyError):
                        field(cc, fid)[2] += grown
    return rewrite_footer(data, edit)


def _encrypted(meta):
    chunk = field(row_groups(meta)[1], 1)[2][1][0]
    chunk.append([8, STRUCT, [[1, STRUCT, []]]])  # crypto_metadata: encrypted with the footer key


def _total(value: int):
    def edit(meta):
        field(meta, 3)[2] = value
    return edit


def _many_chunks_footer(_: bytes) -> bytes:
    """A footer whose one row group declares a million column chunks in ~1 MB of zeros:
    pyarrow's parser would size the list (~700 MB) before finding nothing in it."""
    n = 1_000_000
    thrift = bytes([0x49, 0x1C, 0x19, 0xFC]) + _varint(n) + bytes(n + 10)
    return b"PAR1" + thrift + len(thrift).to_bytes(4, "little") + b"PAR1"


CASES = {
    # name: (file bytes, words the message must hold)
    "truncated": (lambda d: d[:len(d) // 2], "not the Parquet magic"),
    "too short": (lambda d: d[:10], "too short"),
    "bad magic": (lambda d: d[:-4] + b"PAR2", "not the Parquet magic"),
    "encrypted": (lambda d: d[:-4] + b"PARE", "encrypted"),
    "footer longer than the file": (
        lambda d: d[:-8] + (len(d)).to_bytes(4, "little") + b"PAR1", "more than the"),
    "a million column chunks declared": (_many_chunks_footer, "does not parse"),
    "garbage thrift": (lambda d: d[:-8 - 200] + bytes(range(200)) + d[-8:],
                       "does not parse"),
    "chunk past the footer": (lambda d: rewrite_footer(d, _set(9, len(d))), "outside"),
    "chunk size past the footer": (lambda d: rewrite_footer(d, _set(7, 1 << 40)), "outside"),
    "chunk before the magic": (lambda d: rewrite_footer(d, _set(9, 1)), "outside"),
    "negative offset": (lambda d: rewrite_footer(d, _set(9, -5)), "outside"),
    "negative size": (lambda d: rewrite_footer(d, _set(7, -5)), "negative"),
    "huge row count": (lambda d: rewrite_footer(d, _rows(1, 1 << 40, (1 << 40) + 20)),
                       "more than the"),
    "negative row count": (lambda d: rewrite_footer(d, _rows(1, -10, 10)), "declares -10 rows"),
    "row counts do not sum": (lambda d: rewrite_footer(d, _total(31)), "declares 31"),
    "fewer rows than values": (lambda d: rewrite_footer(d, _rows(1, 3, 23)),
                               "10 values for 3 rows"),
    "an encrypted column chunk": (lambda d: rewrite_footer(d, _encrypted), "encrypted"),
    "more values than the budget": (
        lambda d: rewrite_footer(d, _set(5, 1 << 40, column=2)), "memory budget"),
    "a page larger than the budget": (_lying_page, "memory budget"),
    "a page larger than int32 allows": (lambda d: _lying_page(d, -7), "negative"),
}
BUDGET = 64 << 20  # what the cases read under: a lie must not pass it


def verdict(data: bytes) -> str:
    """The error a read of `data` gives (every row group decoded from its own ranges)."""
    try:
        read_all(data, max_bytes=BUDGET, max_rows=1 << 20)
    except ParquetFormatError as e:
        return str(e)
    return "read"


@pytest.mark.parametrize("name", CASES)
def test_a_lie_is_a_clear_error(name):
    make, words = CASES[name]
    message = verdict(make(_good()))
    assert message.startswith(PATH) and words in message, message
    assert "(" in message  # says what to do


def test_errors_name_row_group_and_column_and_pickle():
    with pytest.raises(ParquetFormatError) as e:
        read_all(rewrite_footer(_good(), _set(9, 1 << 30, group=2, column=1)))
    assert e.value.row_group == 2 and e.value.column == "s" and e.value.path == PATH
    again = pickle.loads(pickle.dumps(e.value))
    assert str(again) == str(e.value) and again.row_group == 2


def test_a_footer_longer_than_the_budget_is_refused_before_it_is_read():
    data = _good()
    o, _n = tail_range(len(data), 16)
    with pytest.raises(ParquetFormatError, match="memory budget of 100 bytes"):
        footer_range(PATH, len(data), data[o:], max_bytes=100)


def test_the_footer_must_be_exactly_its_range():
    data = _good()
    o, _n = footer_range(PATH, len(data), data[-8:], max_bytes=BUDGET)
    with pytest.raises(ValueError, match="were given"):
        parse_footer(PATH, len(data), data[o + 1:], max_bytes=BUDGET)


def test_bytes_not_fetched_are_never_read():
    data = _good()
    meta, layout, index = open_file(data, ["s", "l"])
    ranges = fetch(data, index, 1)
    first = min(ranges)
    short = {**ranges, first: ranges[first][:-1]}
    for fetched in ({}, short, {k: v for k, v in ranges.items() if k != first}):
        with pytest.raises(ParquetFormatError, match="were not fetched"):
            decode_row_group(layout, meta, 1, fetched, max_bytes=BUDGET)
    # another row group's bytes are not this one's
    with pytest.raises(ParquetFormatError, match="were not fetched"):
        decode_row_group(layout, meta, 1, fetch(data, index, 0), max_bytes=BUDGET)


def test_a_page_header_that_does_not_parse():
    data = bytearray(_good(compression="none"))
    meta, layout, index = open_file(bytes(data))
    chunk = layout.row_groups[0].chunks[0]
    data[chunk.offset:chunk.offset + 12] = b"\x1c" * 12  # structs nested, never closed
    with pytest.raises(ParquetFormatError, match="page header") as e:
        decode_row_group(layout, meta, 0, fetch(bytes(data), index, 0), max_bytes=BUDGET)
    assert e.value.row_group == 0 and e.value.column == "i"


def test_a_damaged_page_body_is_an_error_or_the_right_length():
    """Without page checksums, a flipped byte inside compressed data is caught by the codec
    or not at all; either way the row group decodes to its declared rows or raises."""
    data = bytearray(_good(compression="snappy"))
    meta, layout, index = open_file(bytes(data))
    chunk = layout.row_groups[0].chunks[1]
    _, body = page_header(bytes(data), chunk.offset)
    data[body + 2] ^= 0xFF
    try:
        table = decode_row_group(layout, meta, 0, fetch(bytes(data), index, 0),
                                 max_bytes=BUDGET)
    except ParquetFormatError as e:
        assert "row group 0" in str(e)
    else:
        assert table.num_rows == 10


CHILD = """
import json, resource, sys
from tests.formats.test_parquet_hostile import CASES, _good, verdict
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
good = _good()
out = {name: verdict(make(good)) for name, (make, _) in CASES.items()}
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"verdicts": out, "grew_kib": after - before}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS, ru_maxrss in KiB: Linux")
def test_the_lies_read_in_bounded_memory():
    """Every case, in one child under a 3 GiB address-space limit (pyarrow's own reserve
    included): none crashes it, and its peak RSS grows by less than 64 MiB."""
    limit = 3 << 30
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip("the address space is already limited")
    out = subprocess.run([sys.executable, "-c", CHILD, str(limit)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for name, (_, words) in CASES.items():
        assert words in got["verdicts"][name], (name, got["verdicts"][name])
    assert got["grew_kib"] < 64 << 10, got


def test_a_chunk_running_into_a_footer_with_trailing_bytes():
    """The footer's declared length, not what its thrift consumed, says where data ends."""
    good = _good(compression="none")
    _, layout, _ = open_file(good)
    last = layout.row_groups[-1].chunks[-1]
    lying = rewrite_footer(good, _set(7, last.length + 5, group=2, column=last.leaf))
    n = int.from_bytes(lying[-8:-4], "little")
    padded = lying[:-8] + bytes(10) + (n + 10).to_bytes(4, "little") + b"PAR1"
    with pytest.raises(ParquetFormatError, match="outside"):
        open_file(padded)


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip", "brotli", "lz4"])
def test_a_dictionary_that_expands_past_the_budget(compression):
    """2000 rows of one 10 kB string: a 10 kB dictionary and tiny pages of indices that
    decode to 20 MB. The bound is the longest dictionary entry times the values."""
    table = pa.table({"i": np.arange(2000), "s": ["x" * 10_000] * 2000})
    data = write(table, compression=compression)
    meta, layout, index = open_file(data, max_bytes=4 << 20)  # the footer's sizes are small
    with pytest.raises(ParquetFormatError, match="memory budget") as e:
        decode_row_group(layout, meta, 0, fetch(data, index, 0), max_bytes=4 << 20)
    assert e.value.column == "s"
    ok = decode_row_group(layout, meta, 0, fetch(data, index, 0), max_bytes=24 << 20)
    assert ok.num_rows == 2000


def test_a_fixed_size_binary_column_counts_its_width():
    table = pa.table({"f": pa.array([b"ab" * 5000] * 100, pa.binary(10_000))})
    with pytest.raises(ParquetFormatError, match="memory budget"):
        open_file(write(table), max_bytes=500_000)  # 1 MB of values
    assert open_file(write(table), max_bytes=2 << 20)[1].num_rows == 100


def test_a_large_dictionary_of_short_entries_fits_by_its_longest_entry():
    """1000 distinct 100-byte strings, 2000 rows: the dictionary page's size times the
    values (~200 MB) would not fit 4 MiB; its longest entry times the values (200 kB) does."""
    table = pa.table({"s": [f"{j % 1000:0100d}" for j in range(2000)]})
    data = write(table, compression="zstd")
    meta, layout, index = open_file(data, max_bytes=4 << 20)
    got = decode_row_group(layout, meta, 0, fetch(data, index, 0), max_bytes=4 << 20)
    assert got.equals(pq.read_table(pa.BufferReader(data)))


def test_size_statistics_that_disagree_with_the_schema_raise_not_abort():
    """pyarrow's column chunk accessor aborts the process on such a footer (a C++
    exception nothing catches); the layout reads the footer itself, and the decode's
    reader turns it into an error."""
    def edit(meta):
        for g in range(len(row_groups(meta))):
            sizes = field(column_meta(meta, g, 0), 16)[2]  # SizeStatistics
            field(sizes, 3)[2] = (I64, [1, 2, 3, 4, 5])  # definition_level_histogram
    data = rewrite_footer(_good(), edit)
    meta, layout, index = open_file(data)
    assert index.num_rows == ROWS
    with pytest.raises(ParquetFormatError, match="row group 0"):
        decode_row_group(layout, meta, 0, fetch(data, index, 0), max_bytes=BUDGET)


def test_a_decoder_goes_on_after_an_error_and_keeps_no_bytes():
    data = _good()
    meta, layout, index = open_file(data)
    decoder = RowGroupDecoder(layout, meta)
    with pytest.raises(ParquetFormatError, match="were not fetched"):
        decoder.table(1, fetch(data, index, 0), max_bytes=BUDGET)
    want = pq.read_table(pa.BufferReader(data))
    for g in (2, 0, 1, 1):
        got = decoder.table(g, fetch(data, index, g), max_bytes=BUDGET)
        assert got.equals(want.slice(10 * g, 10))
        assert decoder._file._views == []  # the fetched bytes go with the call
