"""Parquet files that are valid, or nearly, but would escape the layer's limits: values
whose encoding is not bounded by its bytes, schemas nested past any real one, column
chunks that share bytes, strings that are not UTF-8, names that repeat. Each ends in a
`ParquetFormatError` naming the file (or a `ValueError` naming a caller's argument)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from aioloader import ParquetFormatError
from aioloader.formats.parquet import RowGroupDecoder, decode_row_group
from aioloader.formats.parquet.metadata import MAX_SCHEMA_DEPTH
from tests.support.parquet_files import (
    BIG,
    BINARY,
    I32,
    I64,
    LIST,
    STRUCT,
    column_meta,
    encode_struct,
    fetch,
    field,
    open_file,
    page_header,
    read_all,
    rewrite_footer,
    write,
)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_delta_byte_array_values_past_the_budget(compression):
    """Each value a shared prefix and no suffix: 2000 values of 10 kB in a few kB of pages."""
    table = pa.table({"s": pa.array([b"x" * 10_000] * 2000, pa.binary())})
    data = write(table, use_dictionary=False, column_encoding={"s": "DELTA_BYTE_ARRAY"},
                 compression=compression)
    meta, layout, index = open_file(data, max_bytes=4 << 20)
    with pytest.raises(ParquetFormatError, match="memory budget") as e:
        decode_row_group(layout, meta, 0, fetch(data, index, 0), max_bytes=4 << 20)
    assert e.value.column == "s" and e.value.path is not None


@pytest.mark.parametrize("encoding", ["DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY"])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_delta_strings_within_the_budget_read(encoding, version):
    """Their bound (1000 values, each as long as all the suffixes) passes the budget: they
    decode in batches, counted, and read whole."""
    table = pa.table({"s": [None if j % 7 == 0 else f"key-{j:05d}" for j in range(1000)],
                      "i": np.arange(1000)})
    data = write(table, use_dictionary=False, column_encoding={"s": encoding},
                 data_page_version=version, data_page_size=2000)
    assert read_all(data, max_bytes=1 << 20).equals(table)
    assert read_all(data, ["s"], max_bytes=1 << 20).equals(table.select(["s"]))


def test_repeated_delta_strings_past_the_bound_are_refused():
    """A row may hold any number of a list's values: no batch of rows bounds them."""
    table = pa.table({"l": [[f"key-{j:05d}"] * 2 for j in range(1000)]})
    data = write(table, use_dictionary=False, column_encoding={"l.list.element":
                                                               "DELTA_BYTE_ARRAY"})
    assert read_all(data, max_bytes=1 << 30).equals(table)
    with pytest.raises(ParquetFormatError, match="memory budget"):
        read_all(data, max_bytes=1 << 20)


CHILD = """
import json, resource, sys
from tests.support.parquet_files import open_file, fetch
from aioloader import ParquetFormatError
from aioloader.formats.parquet import decode_row_group
data = open(sys.argv[2], "rb").read()
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
meta, layout, index = open_file(data, max_bytes=4 << 20)
try:
    decode_row_group(layout, meta, 0, fetch(data, index, 0), max_bytes=4 << 20)
    verdict = "read"
except ParquetFormatError as e:
    verdict = str(e)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"verdict": verdict, "grew_kib": after - before}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS, ru_maxrss in KiB: Linux")
def test_delta_byte_array_past_the_budget_in_bounded_memory(tmp_path):
    """A few hundred bytes that decode to 100 MB: refused, and the child's peak RSS grows
    by less than 32 MiB."""
    table = pa.table({"s": pa.array([b"x" * 100_000] * 1000, pa.binary())})
    path = tmp_path / "delta.parquet"
    path.write_bytes(write(table, use_dictionary=False, compression="zstd",
                           column_encoding={"s": "DELTA_BYTE_ARRAY"}))
    del table
    out = subprocess.run([sys.executable, "-c", CHILD, str(3 << 30), str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "memory budget" in got["verdict"], got
    assert got["grew_kib"] < 32 << 10, got


def _deep(depth: int) -> bytes:
    """A file of no rows whose one leaf is under `depth` single-child groups."""
    leaf = [[1, I32, 1], [3, I32, 1], [4, BINARY, b"x"]]
    group = [[3, I32, 1], [4, BINARY, b"g"], [5, I32, 1]]
    schema = [[[4, BINARY, b"schema"], [5, I32, 1]]] + [group] * depth + [leaf]
    meta = [[1, I32, 1], [2, LIST, (STRUCT, schema)], [3, I64, 0], [4, LIST, (STRUCT, [])]]
    footer = encode_struct(meta)
    return b"PAR1" + footer + struct.pack("<I", len(footer)) + b"PAR1"


def test_a_schema_at_the_depth_limit_reads():
    _meta, layout, _index = open_file(_deep(MAX_SCHEMA_DEPTH))
    assert layout.columns == ("g",) and layout.num_rows == 0


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 1000])
def test_a_schema_nested_too_deep(depth):
    with pytest.raises(ParquetFormatError, match="nests deeper") as e:
        open_file(_deep(depth))
    assert e.value.path is not None


def test_a_schema_nested_thousands_deep_does_not_crash():
    """pyarrow's schema conversion overflows the stack: the child must not die."""
    code = ("import sys; from tests.formats.test_parquet_limits import _deep, open_file\n"
            "from aioloader import ParquetFormatError\n"
            "try: open_file(_deep(20000))\n"
            "except ParquetFormatError as e: print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nests deeper" in out.stdout


@pytest.mark.parametrize("children", [-1, 5])
def test_a_schema_whose_child_counts_lie(children):
    meta = [[1, I32, 1],
            [2, LIST, (STRUCT, [[[4, BINARY, b"schema"], [5, I32, children]],
                                [[1, I32, 1], [3, I32, 1], [4, BINARY, b"x"]]])],
            [3, I64, 0], [4, LIST, (STRUCT, [])]]
    footer = encode_struct(meta)
    with pytest.raises(ParquetFormatError, match="children"):
        open_file(b"PAR1" + footer + struct.pack("<I", len(footer)) + b"PAR1")


def _two_columns() -> bytes:
    return write(pa.table({"a": pa.array(range(10)), "b": pa.array(range(100, 110))}),
                 compression="none", use_dictionary=False, write_statistics=False,
                 row_group_size=5)


@pytest.mark.parametrize("other", [(0, 0), (1, 0)])
def test_column_chunks_that_share_bytes(other):
    """Column b of row group 0 claims the bytes of `other` (row group, column)."""
    def edit(m):
        b = column_meta(m, 0, 1)
        for fid in (6, 7, 9):
            field(b, fid)[2] = field(column_meta(m, *other), fid)[2]
    with pytest.raises(ParquetFormatError, match="are also those of column") as e:
        open_file(rewrite_footer(_two_columns(), edit))
    assert e.value.row_group is not None and e.value.column is not None


def test_strings_that_are_not_utf8():
    data = write(pa.table({"i": [1, 2], "s": ["abc", "def"]}), compression="none",
                 use_dictionary=False, write_statistics=False)
    data = bytearray(data)
    data[data.rindex(b"def") + 1] = 0x80
    meta, layout, index = open_file(bytes(data))
    with pytest.raises(ParquetFormatError, match="UTF8") as e:
        RowGroupDecoder(layout, meta).table(0, fetch(bytes(data), index, 0), max_bytes=BIG)
    assert e.value.column == "s" and e.value.row_group == 0


def test_a_column_selected_twice_is_the_callers_error():
    data = _two_columns()
    with pytest.raises(ValueError, match="columns argument") as e:
        open_file(data, ["a", "a"])
    assert not isinstance(e.value, ParquetFormatError)


def test_a_file_with_repeated_top_level_names():
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])],
                                 names=["a", "a", "b"])
    data = write(table)
    with pytest.raises(ParquetFormatError, match="more than one top-level column named 'a'"
                       ) as e:
        open_file(data)
    assert "columns=" in str(e.value)
    assert read_all(data, ["b"]).column("b").to_pylist() == [3]


def test_a_dictionary_page_that_declares_more_values_than_its_bytes_hold():
    data = write(pa.table({"i": pa.array(np.arange(100) % 100, pa.int64())}),
                 compression="none", write_statistics=False)
    _meta, layout, _index = open_file(data)
    chunk = layout.row_groups[0].chunks[0]
    header, body = page_header(data, chunk.offset)
    assert field(header, 1)[2] == 2  # a dictionary page
    field(field(header, 7)[2], 1)[2] = 8000  # 100 before: the same varint length
    new = encode_struct(header)
    assert len(new) == body - chunk.offset
    data = data[:chunk.offset] + new + data[body:]
    meta, layout, index = open_file(data)
    with pytest.raises(ParquetFormatError, match="dictionary page declares") as e:
        decode_row_group(layout, meta, 0, fetch(data, index, 0), max_bytes=BIG)
    assert e.value.column == "i"

