"""A Parquet file's lean layout: per row group its row count and, for the selected columns,
each column chunk's byte range, with every declared figure checked.

The planner and the fetch step need only these numbers, not pyarrow's `FileMetaData`
(whose objects are heavy and cost a thrift parse to rebuild in each worker). Columns are
selected by their top-level names, as an element is one row: a dict name -> value; a name
selects every leaf column beneath it (a struct's fields, a list's items).

A file can lie, so before anything trusts it: row counts are non-negative, sum to the
file's, and fit `max_rows`; each selected column chunk lies inside the file's data
(`[4, footer offset)`), counts as many values as its row group has rows (at least as many,
for a repeated column), and the row group's declared bytes (its values at least as wide as
their type) fit `max_bytes`. A lie is a
`ParquetFormatError` naming the file, row group and column.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import BUDGET_HINT, CORRUPT_HINT, ParquetFormatError
from .footer import MAGIC, TRAILER, ParquetFooter
from .metadata import ChunkMeta

__all__ = ["ColumnChunk", "ParquetLayout", "RowGroupLayout", "read_layout"]

#: bytes of decoded bookkeeping per value a budget counts (levels, offsets, validity)
VALUE_COST = 8
#: bytes a value of each fixed-width physical type decodes to
WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
#: parquet-mr before 1.2.9 left the dictionary page's header out of a chunk's size; Arrow
#: reads up to this many bytes more after such a chunk, and so must the fetch
OLD_WRITER_PADDING = 100
_OLD_WRITER = re.compile(r"parquet-mr version (\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class ColumnChunk:
    """One selected leaf column's bytes in one row group."""

    leaf: int          #: the leaf column's index in the file's schema
    path: str          #: its dotted path, for messages
    offset: int        #: its first byte: the dictionary page if any, else the first data page
    length: int        #: bytes to fetch from `offset` (what Arrow's reader will read)
    num_values: int    #: values (levels) it declares: its row group's rows, or more if repeated
    uncompressed: int  #: its declared decompressed size
    codec: str = "UNCOMPRESSED"  #: its compression, as the footer names it
    width: int = 0     #: bytes a decoded value takes, or 0 for variable-length (BYTE_ARRAY)
    repeated: bool = False  #: a row may hold any number of its values

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class RowGroupLayout:
    num_rows: int
    chunks: tuple[ColumnChunk, ...]  #: the selected leaves', in schema order


@dataclass(frozen=True)
class ParquetLayout:
    path: str
    size: int
    footer_offset: int  #: where the thrift `FileMetaData` starts; data ends there
    columns: tuple[str, ...]  #: the selected top-level names, in the order asked for
    leaves: tuple[int, ...]  #: their leaf columns' indices in the schema, ascending
    row_groups: tuple[RowGroupLayout, ...]

    @property
    def num_rows(self) -> int:
        return sum(g.num_rows for g in self.row_groups)


def read_layout(path: str, size: int, footer: ParquetFooter,
                columns: Sequence[str] | None = None, *, max_rows: int,
                max_bytes: int) -> ParquetLayout:
    """The layout of the file whose parsed footer (`parse_footer`) is `footer`: the data
    ends where the footer's bytes start (its thrift may take fewer).

    `columns`: top-level names (None: all, in file order). `max_rows` bounds one row
    group's rows and `max_bytes` its selected columns' declared bytes (compressed, and
    decompressed, with values at least as wide as their type, plus `VALUE_COST` per value):
    the memory one decoded row group may take.
    """
    if columns is not None and len(set(columns)) != len(columns):
        twice = sorted({c for c in columns if list(columns).count(c) > 1})
        raise ValueError(f"{path}: the columns argument names {twice} more than once: "
                         f"{list(columns)}")
    footer_offset = size - len(footer.data)
    if not TRAILER <= len(footer.data) <= size - len(MAGIC):
        raise ValueError(f"{path}: a footer of {len(footer.data)} bytes in a file of {size}")
    figures, meta = footer.figures, footer.meta
    try:  # the schema, from pyarrow: a name that is not UTF-8 raises while it is read
        names, leaves = _select(path, meta, columns)
        schema = {i: meta.schema.column(i) for i in leaves}
        paths = {i: c.path for i, c in schema.items()}
        repeated = {i: c.max_repetition_level > 0 for i, c in schema.items()}
        widths = {i: c.length if c.physical_type == "FIXED_LEN_BYTE_ARRAY"
                  else WIDTHS.get(c.physical_type, 0) for i, c in schema.items()}
        num_columns = meta.num_columns
    except (ValueError, IndexError) as e:
        if isinstance(e, ParquetFormatError):
            raise
        raise ParquetFormatError(f"its schema does not read: {e}", path=path,
                                 hint=CORRUPT_HINT) from None
    padding = OLD_WRITER_PADDING if _old_writer(figures.created_by) else 0
    groups, total = [], 0
    spans: list[tuple[int, int, int, str]] = []  # each chunk's bytes, without padding
    for g, rg in enumerate(figures.row_groups):
        rows = rg.num_rows
        if rows < 0:
            raise ParquetFormatError(f"declares {rows} rows", path=path, row_group=g,
                                     hint=CORRUPT_HINT)
        if rows > max_rows:
            raise ParquetFormatError(f"declares {rows} rows, more than the {max_rows} one "
                                     "row group may hold", path=path, row_group=g,
                                     hint=BUDGET_HINT)
        if len(rg.columns) != num_columns:
            raise ParquetFormatError(f"has {len(rg.columns)} column chunks for "
                                     f"{num_columns} columns", path=path, row_group=g,
                                     hint=CORRUPT_HINT)
        total += rows
        chunks = tuple(_chunk(path, g, rows, rg.columns[i], i, paths[i], repeated[i],
                              widths[i], footer_offset, size, padding) for i in leaves)
        _check_budget(path, g, rows, chunks, max_bytes)
        groups.append(RowGroupLayout(rows, chunks))
        spans.extend((c.offset, c.offset + rg.columns[c.leaf].compressed, g, c.path)
                     for c in chunks if c.length)
    _check_disjoint(path, spans)
    if total != figures.num_rows:
        raise ParquetFormatError(f"its row groups hold {total} rows, its footer declares "
                                 f"{figures.num_rows}", path=path, hint=CORRUPT_HINT)
    return ParquetLayout(path, size, footer_offset, names, leaves, tuple(groups))


def _chunk(path: str, g: int, rows: int, col: ChunkMeta, leaf: int, name: str,
           repeated: bool, width: int, data_end: int, size: int,
           padding: int) -> ColumnChunk:
    def bad(what: str, offset: int | None = None) -> ParquetFormatError:
        return ParquetFormatError(what, path=path, row_group=g, column=name, offset=offset,
                                  hint=CORRUPT_HINT)

    if col.file_path:
        raise ParquetFormatError(f"its column chunk lives in another file ({col.file_path!r})"
                                 ", which is not supported", path=path, row_group=g,
                                 column=name, hint="rewrite the data as one file")
    if col.encrypted:
        raise ParquetFormatError("its column chunk is encrypted, which is not supported",
                                 path=path, row_group=g, column=name,
                                 hint="write the file without Parquet modular encryption")
    if rows == 0:  # nothing to read (pyarrow writes such chunks at offset 0): fetch nothing
        if col.num_values != 0:
            raise bad(f"declares {col.num_values} values for 0 rows")
        return ColumnChunk(leaf, name, 0, 0, 0, 0, col.codec, width)
    # Where Arrow's reader starts: the dictionary page when there is one before the data.
    start = col.data_page_offset
    dictionary = col.dictionary_page_offset
    if dictionary is not None and 0 < dictionary < start:
        start = dictionary
    length = col.compressed
    if length < 0 or col.uncompressed < 0 or col.num_values < 0:
        raise bad(f"declares a negative size or count ({length} bytes, "
                  f"{col.uncompressed} decompressed, {col.num_values} values)")
    if start < len(MAGIC) or start + length > data_end:
        raise bad(f"declares bytes [{start}, {start + length}), outside the file's data "
                  f"[{len(MAGIC)}, {data_end})", start)
    if not start <= col.data_page_offset < start + length:
        raise bad(f"declares its first data page at byte {col.data_page_offset}, outside "
                  f"its bytes [{start}, {start + length})", col.data_page_offset)
    if col.num_values < rows or (not repeated and col.num_values != rows):
        raise bad(f"declares {col.num_values} values for {rows} rows")
    length += min(padding, size - start - length)
    return ColumnChunk(leaf, name, start, length, col.num_values, col.uncompressed,
                       col.codec, width, repeated)


def _check_disjoint(path: str, spans: list[tuple[int, int, int, str]]) -> None:
    """Two column chunks sharing bytes would decode one's pages as the other's values."""
    spans.sort()
    for (_, end, g0, name0), (start, _, g, name) in itertools.pairwise(spans):
        if start < end:
            raise ParquetFormatError(
                f"its bytes from {start} are also those of column {name0!r} in row group "
                f"{g0}", path=path, row_group=g, column=name, offset=start,
                hint=CORRUPT_HINT)


def _check_budget(path: str, g: int, rows: int, chunks: tuple[ColumnChunk, ...],
                  max_bytes: int) -> None:
    fetched = sum(c.length for c in chunks)
    # values at least as wide as their type (a dictionary's indices expand to them)
    decoded = sum(max(c.uncompressed, c.width * c.num_values) + VALUE_COST * c.num_values
                  for c in chunks)
    if max(fetched, decoded) > max_bytes:
        raise ParquetFormatError(
            f"its selected columns declare {fetched} bytes, {decoded} decoded for {rows} "
            f"rows, more than the memory budget of {max_bytes} bytes allows", path=path,
            row_group=g, hint=BUDGET_HINT)


def _select(path: str, meta: Any, columns: Sequence[str] | None
            ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The selected top-level names and their leaf columns, from the Arrow schema (a name
    may hold dots, so the leaves' dotted paths cannot say which field they belong to)."""
    try:
        schema = meta.schema.to_arrow_schema()
    except Exception as e:
        raise ParquetFormatError(f"its schema does not convert to Arrow: {e}", path=path,
                                 hint=CORRUPT_HINT) from None
    spans: dict[str, list[range]] = {}
    first = 0
    for field in schema:
        n = _leaves(field.type)
        spans.setdefault(field.name, []).append(range(first, first + n))
        first += n
    if first != meta.num_columns:
        raise ParquetFormatError(f"its schema has {first} leaf columns, its footer "
                                 f"{meta.num_columns}", path=path, hint=CORRUPT_HINT)
    names = tuple(schema.names) if columns is None else tuple(columns)
    if columns is None and len(spans) != len(names):
        twice = sorted(n for n, found in spans.items() if len(found) > 1)
        raise ParquetFormatError(
            f"has more than one top-level column named {twice[0]!r}, and a row holds one "
            "value per name", path=path,
            hint=f"pass columns= with names that are not repeated (its columns are "
                 f"{schema.names})")
    leaves: list[int] = []
    for name in names:
        found = spans.get(name, [])
        if len(found) != 1:
            raise ParquetFormatError(
                f"has {'no' if not found else len(found)} top-level column named {name!r}",
                path=path, hint=f"its columns are {schema.names}")
        leaves.extend(found[0])
    return names, tuple(sorted(leaves))


def _leaves(t: Any) -> int:
    """The leaf columns under an Arrow type: a loop, not recursion (the footer's reader
    bounds the depth, but a deep type must not reach Python's recursion limit)."""
    import pyarrow as pa

    lists = (pa.ListType, pa.LargeListType, pa.FixedSizeListType,
             *(getattr(pa, n) for n in ("ListViewType", "LargeListViewType") if hasattr(pa, n)))
    count, todo = 0, [t]
    while todo:
        t = todo.pop()
        if isinstance(t, pa.ExtensionType):
            todo.append(t.storage_type)
        elif isinstance(t, pa.StructType):
            todo.extend(t.field(i).type for i in range(t.num_fields))
        elif isinstance(t, pa.MapType):
            todo.extend((t.key_type, t.item_type))
        elif isinstance(t, lists):
            todo.append(t.value_type)
        else:
            count += 1
    return count


def _old_writer(created_by: str | None) -> bool:
    """Whether Arrow pads this writer's chunks (parquet-mr before 1.2.9), as its reader does."""
    m = _OLD_WRITER.match(created_by or "")
    return m is not None and tuple(map(int, m.groups())) < (1, 2, 9)
