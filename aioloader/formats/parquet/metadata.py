"""The row groups' figures, read from the footer's thrift by our own reader (`thrift.py`).

pyarrow's `FileMetaData` gives the same figures, but its column chunk accessor
(`row_group(g).column(i)`) runs C++ that throws where no handler catches it, so some
malformed footers (size statistics whose histograms disagree with the schema, among
others) abort the whole process instead of raising. The layout therefore reads row counts,
codecs and byte ranges here, with every length held to the footer's bytes, and leaves
pyarrow the schema (whose conversion raises properly) and the decoding (whose reader
catches its own exceptions).
"""

from __future__ import annotations

from dataclasses import dataclass

from .thrift import BINARY, I32, I64, LIST, STRUCT, ThriftError, ThriftReader

__all__ = ["MAX_SCHEMA_DEPTH", "ChunkMeta", "FooterMeta", "RowGroupMeta", "SchemaTooDeep",
           "read_footer_meta"]

#: the deepest schema read. Real schemas nest a few levels (a list of structs of lists...);
#: Arrow's schema conversion recurses once per level on the C stack, so a few thousand
#: single-child groups crash the process. 64 levels is far past any real schema and far
#: below where any recursion (Arrow's or ours) runs short.
MAX_SCHEMA_DEPTH = 64

#: Parquet's codec enum, as pyarrow names the codecs
CODECS = ("UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW")


@dataclass(frozen=True)
class ChunkMeta:
    """A column chunk's `ColumnMetaData` figures the layout needs."""

    codec: str
    num_values: int
    uncompressed: int
    compressed: int
    data_page_offset: int
    dictionary_page_offset: int | None  # None: no dictionary page
    file_path: str | None = None  # another file holds its bytes
    encrypted: bool = False


@dataclass(frozen=True)
class RowGroupMeta:
    num_rows: int
    columns: tuple[ChunkMeta, ...]


@dataclass(frozen=True)
class FooterMeta:
    num_rows: int
    created_by: str
    row_groups: tuple[RowGroupMeta, ...]


def read_footer_meta(footer: bytes | memoryview) -> FooterMeta:
    """The row groups of the thrift `FileMetaData` that starts `footer` (its bytes, the 8
    after it included); `ThriftError` when it does not parse or lacks a required field."""
    view = memoryview(footer)
    t = ThriftReader(view, 0, max(len(view) - 8, 0))
    num_rows, created_by, groups = None, "", []
    for fid, kind in t.fields():
        if fid == 2 and kind == LIST:
            _check_schema(t)
        elif fid == 3 and kind == I64:
            num_rows = t.integer()
        elif fid == 4 and kind == LIST:
            groups = [_row_group(t) for _ in _structs(t)]
        elif fid == 6 and kind == BINARY:
            created_by = t.binary().decode("utf-8", "replace")
        else:
            t.skip(kind)
    if num_rows is None:
        raise ThriftError("the footer has no row count", t.pos)
    return FooterMeta(num_rows, created_by, tuple(groups))


def _structs(t: ThriftReader) -> range:
    elem, count = t.list_header()
    if elem != STRUCT and count:
        raise ThriftError(f"a list of thrift type {elem} where structs belong", t.pos)
    return range(count)


class SchemaTooDeep(ThriftError):
    """A schema that parses but nests deeper than `MAX_SCHEMA_DEPTH`."""


def _check_schema(t: ThriftReader) -> None:
    """Walks the flattened schema (each group element followed by its `num_children`
    children, depth first): every count must fit the elements there, and the nesting
    must stay within `MAX_SCHEMA_DEPTH`, before pyarrow converts it."""
    open_children: list[int] = []  # per open group, the children still to come
    for i in _structs(t):
        start, children = t.pos, 0
        for fid, kind in t.fields():
            if fid == 5 and kind == I32:
                children = t.integer()
            else:
                t.skip(kind, 1)
        if children < 0:
            raise ThriftError(f"schema element {i} declares {children} children", start)
        if open_children:
            open_children[-1] -= 1
        elif i:
            raise ThriftError(f"schema element {i} lies outside the root's children", start)
        if children or not i:
            open_children.append(children)
            if len(open_children) > MAX_SCHEMA_DEPTH + 1:
                raise SchemaTooDeep(f"its schema nests deeper than {MAX_SCHEMA_DEPTH} "
                                    "levels, which is not supported", start)
        while open_children and open_children[-1] == 0:
            open_children.pop()
    if open_children:
        raise ThriftError(f"the schema's groups declare {sum(open_children)} more children "
                          "than it holds", t.pos)


def _row_group(t: ThriftReader) -> RowGroupMeta:
    num_rows, columns = None, []
    for fid, kind in t.fields():
        if fid == 1 and kind == LIST:
            columns = [_column_chunk(t) for _ in _structs(t)]
        elif fid == 3 and kind == I64:
            num_rows = t.integer()
        else:
            t.skip(kind, 1)
    if num_rows is None:
        raise ThriftError("a row group has no row count", t.pos)
    return RowGroupMeta(num_rows, tuple(columns))


def _column_chunk(t: ThriftReader) -> ChunkMeta:
    file_path, meta, encrypted = None, None, False
    for fid, kind in t.fields():
        if fid == 1 and kind == BINARY:
            file_path = t.binary().decode("utf-8", "replace") or None
        elif fid == 3 and kind == STRUCT:
            meta = _column_meta(t)
        elif fid in (8, 9):  # crypto_metadata, encrypted_column_metadata
            encrypted = True
            t.skip(kind, 2)
        else:
            t.skip(kind, 2)
    if meta is None:
        if encrypted:
            return ChunkMeta("UNCOMPRESSED", 0, 0, 0, 0, None, file_path, True)
        raise ThriftError("a column chunk has no metadata", t.pos)
    return ChunkMeta(*meta, file_path=file_path, encrypted=encrypted)


def _column_meta(t: ThriftReader) -> tuple[str, int, int, int, int, int | None]:
    got: dict[int, int] = {}
    for fid, kind in t.fields():
        if (fid == 4 and kind == I32) or (fid in (5, 6, 7, 9, 11) and kind == I64):
            got[fid] = t.integer()
        else:
            t.skip(kind, 3)
    missing = [f for f in (4, 5, 6, 7, 9) if f not in got]
    if missing:
        raise ThriftError(f"a column chunk's metadata lacks fields {missing}", t.pos)
    codec = CODECS[got[4]] if 0 <= got[4] < len(CODECS) else f"codec {got[4]}"
    return codec, got[5], got[6], got[7], got[9], got.get(11)
