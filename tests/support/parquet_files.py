"""Parquet files for the tests of aioloader/formats/parquet: written by pyarrow into bytes,
read back every way the loader will (tail, footer, layout, index, each row group from only
its fetched ranges), and rewritten to lie.

`Thrift` is a small codec of thrift's compact protocol, independent of the code under test,
so that a test can decode a real footer or page header, change one field (a row count, an
offset, a page size) and encode it again: a file that lies with valid thrift.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from aioloader.formats.parquet import (
    ParquetFileIndex,
    RowGroupDecoder,
    decode_row_group,
    footer_from_tail,
    footer_range,
    parse_footer,
    read_layout,
    rows,
    tail_range,
)

BIG = 1 << 40  # a budget that never binds
PATH = "mem://t.parquet"


def write(table: pa.Table, **kw: Any) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kw)
    return buf.getvalue()


def open_file(data: bytes, columns: Sequence[str] | None = None, *, max_rows: int = BIG,
              max_bytes: int = BIG, tail_bytes: int | None = None):
    """(meta, layout, index) as the index step gets them: a speculative tail, then the
    footer's own range when the tail is short."""
    size = len(data)
    o, n = tail_range(size) if tail_bytes is None else tail_range(size, tail_bytes)
    footer = footer_from_tail(PATH, size, data[o:o + n], max_bytes=max_bytes)
    if footer is None:
        fo, fn = footer_range(PATH, size, data[o:o + n], max_bytes=max_bytes)
        footer = data[fo:fo + fn]
    parsed = parse_footer(PATH, size, footer, max_bytes=max_bytes)
    layout = read_layout(PATH, size, parsed, columns, max_rows=max_rows, max_bytes=max_bytes)
    return parsed.meta, layout, ParquetFileIndex.from_layout(layout)


def fetch(data: bytes, index: ParquetFileIndex, group: int) -> dict[int, bytes]:
    """Only the ranges the index names for `group`, each a separate bytes object."""
    return {o: data[o:o + n] for o, n in index.fetch_ranges(group)}


def read_all(data: bytes, columns: Sequence[str] | None = None, *,
             max_bytes: int = BIG, max_rows: int = BIG) -> pa.Table:
    meta, layout, index = open_file(data, columns, max_bytes=max_bytes, max_rows=max_rows)
    decoder = RowGroupDecoder(layout, meta)  # one per file, as a worker keeps it
    tables = [decoder.table(g, fetch(data, index, g), max_bytes=max_bytes)
              for g in range(index.num_row_groups)]
    if not tables:
        return pq.read_table(pa.BufferReader(data), columns=columns).slice(0, 0)
    if not tables[0].num_columns:  # concat_tables loses the rows of tables without columns
        return pa.table({"_": pa.nulls(sum(t.num_rows for t in tables))}).drop_columns("_")
    return pa.concat_tables(tables)


def read_elements(data: bytes, columns: Sequence[str] | None = None) -> list[dict]:
    meta, layout, index = open_file(data, columns)
    out: list[dict] = []
    for g in range(index.num_row_groups):
        out.extend(rows(decode_row_group(layout, meta, g, fetch(data, index, g),
                                         max_bytes=BIG)))
    return out


# -- thrift's compact protocol, for crafting lies -------------------------------------------

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)


class Thrift:
    """A struct as a list of [field id, type, value]; lists as (element type, [values])."""

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def value(self, kind: int) -> Any:
        if kind in (TRUE, FALSE):
            return kind == TRUE
        if kind == BYTE:
            self.pos += 1
            return self.buf[self.pos - 1]
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            self.pos += 8
            return self.buf[self.pos - 8:self.pos]
        if kind == BINARY:
            n = self.varint()
            self.pos += n
            return self.buf[self.pos - n:self.pos]
        if kind in (LIST, SET):
            head = self.buf[self.pos]
            self.pos += 1
            count = head >> 4 if head >> 4 != 15 else self.varint()
            elem = head & 0x0F
            if elem in (TRUE, FALSE):
                items = []
                for _ in range(count):
                    items.append(self.buf[self.pos] == 1)
                    self.pos += 1
                return (elem, items)
            return (elem, [self.value(elem) for _ in range(count)])
        if kind == MAP:
            count = self.varint()
            if not count:
                return (0, 0, [])
            kv = self.buf[self.pos]
            self.pos += 1
            return (kv >> 4, kv & 0x0F,
                    [(self.value(kv >> 4), self.value(kv & 0x0F)) for _ in range(count)])
        if kind == STRUCT:
            return self.struct()
        raise ValueError(kind)

    def struct(self) -> list[list[Any]]:
        fields, last = [], 0
        while True:
            head = self.buf[self.pos]
            self.pos += 1
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            fields.append([fid, kind, self.value(kind)])
            last = fid


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(v: int) -> bytes:
    return _varint((v << 1) ^ (v >> 63))


def encode_value(kind: int, value: Any) -> bytes:
    if kind in (TRUE, FALSE):
        return b""
    if kind == BYTE:
        return bytes([value])
    if kind in (I16, I32, I64):
        return _zigzag(value)
    if kind == DOUBLE:
        return bytes(value)
    if kind == BINARY:
        return _varint(len(value)) + bytes(value)
    if kind in (LIST, SET):
        elem, items = value
        head = bytes([(len(items) << 4) | elem]) if len(items) < 15 \
            else bytes([0xF0 | elem]) + _varint(len(items))
        if elem in (TRUE, FALSE):
            return head + bytes(1 if v else 2 for v in items)
        return head + b"".join(encode_value(elem, v) for v in items)
    if kind == MAP:
        kt, vt, items = value
        if not items:
            return b"\x00"
        return _varint(len(items)) + bytes([(kt << 4) | vt]) + b"".join(
            encode_value(kt, k) + encode_value(vt, v) for k, v in items)
    if kind == STRUCT:
        return encode_struct(value)
    raise ValueError(kind)


def encode_struct(fields: list[list[Any]]) -> bytes:
    out, last = bytearray(), 0
    for fid, kind, value in fields:
        if kind in (TRUE, FALSE):
            kind = TRUE if value else FALSE
        if 0 < fid - last <= 15:
            out.append(((fid - last) << 4) | kind)
        else:
            out.append(kind)
            out += _zigzag(fid)
        out += encode_value(kind, value)
        last = fid
    out.append(0)
    return bytes(out)


def field(fields: list[list[Any]], fid: int) -> list[Any]:
    """The [id, type, value] entry of field `fid` (KeyError when absent)."""
    for f in fields:
        if f[0] == fid:
            return f
    raise KeyError(fid)


# FileMetaData: 3 num_rows, 4 row_groups; RowGroup: 1 columns, 3 num_rows;
# ColumnChunk: 3 meta_data; ColumnMetaData: 5 num_values, 6 total_uncompressed_size,
# 7 total_compressed_size, 9 data_page_offset, 11 dictionary_page_offset.
def row_groups(meta: list) -> list:
    return field(meta, 4)[2][1]


def column_meta(meta: list, group: int, column: int) -> list:
    return field(field(row_groups(meta)[group], 1)[2][1][column], 3)[2]


def rewrite_footer(data: bytes, edit: Callable[[list], None]) -> bytes:
    """`data` with its footer decoded, passed to `edit` (which changes it in place), and
    encoded again: valid thrift, valid framing, and whatever lie `edit` told."""
    n = struct.unpack("<I", data[-8:-4])[0]
    start = len(data) - 8 - n
    meta = Thrift(data, start).struct()
    edit(meta)
    footer = encode_struct(meta)
    return data[:start] + footer + struct.pack("<I", len(footer)) + b"PAR1"


def page_header(data: bytes, offset: int) -> tuple[list, int]:
    """The page header at `offset` and where its page's bytes begin."""
    t = Thrift(data, offset)
    return t.struct(), t.pos


def damaged_row_group(path: Any, repeat: int) -> None:
    """Writes to `path` a Parquet file of 300 rows of text (each "value i " × `repeat`), 100
    a row group, snappy, no dictionary, whose row group 1's data page bytes (not its header)
    are flipped: a file whose footer is honest and whose row group 1 cannot decode."""
    import aioloader as al

    pq.write_table(pa.table({"s": [f"value {i} " * repeat for i in range(300)]}), path,
                   row_group_size=100, compression="snappy", use_dictionary=False)
    data = bytearray(path.read_bytes())
    with al.ParquetSource(str(path)) as src:
        ix = src.file_indices[0]
        start, end = int(ix.chunk_offsets[1]), int(ix.chunk_ends[1])
    for at in range(start + 40, end, 7):  # the page's compressed values, not its header
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))
