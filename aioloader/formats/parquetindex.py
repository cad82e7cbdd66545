"""Parquet's chunk table for the formats seam: one chunk per row group, built sans-I/O.

`open_index` is the `RecordFormat.open_index` step for Parquet: it yields the speculative
tail read (`parquet.tail_range`), the footer's own range when the footer is longer than the
tail, and returns the `FileIndex` the rest of the loader works on. Every declared figure is
checked by the Parquet layer (`parquet.parse_footer`, `parquet.read_layout`) before the
table is built.

A row group is a chunk: its records are its rows, and its range runs from its first
selected column chunk's start to its last one's end. Chunks tile the file up to the footer
(the loader's chunk table is offsets only), so the bytes from there to the next row
group's selected bytes (unselected columns; a page index) are a chunk of no rows, which
nothing asks for, so they are never fetched. With every column selected a row group's
range is exactly its bytes; with some, only the unselected columns between the first and
the last selected one are read (not decoded). The decoded size is the selected chunks'
declared decompressed bytes. Row groups must lie in file order; a file whose row groups
do not is refused.

The index's `context` is the footer's bytes and the selected columns
(`parquetchunks.pack_context`): what a worker decodes the file's chunks by.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..arrayrecord.fileindex import FileIndex, compact_sizes
from .parquet.errors import CORRUPT_HINT, ParquetFormatError
from .parquet.footer import footer_from_tail, footer_range, parse_footer, tail_range
from .parquet.layout import ParquetLayout, read_layout
from .parquetchunks import pack_context

if TYPE_CHECKING:
    from .base import IndexSteps

__all__ = ["chunk_table", "open_index"]


def open_index(size: int, *, path: str | None, max_decoded: int,
               columns: Sequence[str] | None = None,
               max_rows: int | None = None) -> IndexSteps:
    """The chunk table of the Parquet file of `size` bytes (see the module's docstring).
    `max_decoded` bounds the footer and one row group's selected bytes; `max_rows` one row
    group's rows (default: `max_decoded`, a row taking at least a byte)."""
    name = path if path is not None else "<parquet>"
    offset, length = tail_range(size)
    tail = yield (offset, length)
    _check_read(name, offset, length, tail)
    footer = footer_from_tail(name, size, tail, max_bytes=max_decoded)
    if footer is None:
        offset, length = footer_range(name, size, tail, max_bytes=max_decoded)
        data = yield (offset, length)
        _check_read(name, offset, length, data)
        footer = bytes(data)
    parsed = parse_footer(name, size, footer, max_bytes=max_decoded)
    layout = read_layout(name, size, parsed, columns,
                         max_rows=max_decoded if max_rows is None else max_rows,
                         max_bytes=max_decoded)
    return chunk_table(layout, path=path,
                       context=pack_context(size, layout.columns, bytes(footer)))


def chunk_table(layout: ParquetLayout, *, path: str | None, context: bytes = b"") -> FileIndex:
    """The `FileIndex` of `layout`: a chunk per row group that holds selected bytes, from
    its first selected column chunk's start to its last one's end, and a chunk of no rows
    over the bytes from there to the next row group's chunk (or the footer) where there
    are any; with `context` (`parquetchunks.pack_context`: what its workers decode the
    chunks by)."""
    offsets: list[int] = []
    rows: list[int] = []
    sizes: list[int] = []
    end = 0  # where the last row group's selected bytes end
    for g, rg in enumerate(layout.row_groups):
        chunks = [c for c in rg.chunks if c.length]
        if not chunks:
            if rg.num_rows:  # (read_layout refuses rows without bytes; kept as a guard)
                raise ParquetFormatError("holds rows but no selected bytes", path=layout.path,
                                         row_group=g, hint=CORRUPT_HINT)
            continue
        start = min(c.offset for c in chunks)
        if offsets and start < end:
            raise ParquetFormatError(
                f"starts at byte {start}, before the row group ahead of it ends (at "
                f"{end}): row groups out of file order are not supported",
                path=layout.path, row_group=g, offset=start,
                hint="rewrite the file with pyarrow.parquet.write_table")
        if offsets and start > end:  # the unselected bytes between: never fetched
            offsets.append(end)
            rows.append(0)
            sizes.append(0)
        offsets.append(start)
        rows.append(rg.num_rows)
        sizes.append(sum(c.uncompressed for c in chunks))
        end = max(c.end for c in chunks)
    if offsets and end < layout.footer_offset:
        offsets.append(end)
        rows.append(0)
        sizes.append(0)
    return FileIndex(path=path, size=layout.size, footer_offset=layout.footer_offset,
                     chunk_offsets=np.asarray(offsets, dtype=np.int64),
                     chunk_records=np.asarray(rows, dtype=np.int64),
                     chunk_decoded_sizes=compact_sizes(np.asarray(sizes, dtype=np.int64)),
                     writer_options="", context=context)


def _check_read(path: str, offset: int, length: int, got) -> None:
    if len(got) != length:
        raise ParquetFormatError(f"short read: asked for {length} bytes at {offset}, got "
                                 f"{len(got)}", path=path, offset=offset,
                                 hint="the object changed or was truncated while reading")
