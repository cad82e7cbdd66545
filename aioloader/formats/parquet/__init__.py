"""Parquet, the pure part: footer, row-group layout and row-group decoding from bytes.

An element is one row (a dict column name -> value, `rows.py`); a row group plays the role
of an ArrayRecord chunk: the unit fetched and decoded whole. Nothing here does I/O or uses
asyncio; pyarrow (the `parquet` extra) is imported only when a file is opened or decoded.

How it plugs into the formats seam:

- index step (the parent, once per file, cached): read `footer.tail_range(size)`; cut the
  footer out of it with `footer_from_tail`, or read `footer_range(...)` when it is longer;
  `footer = parse_footer(...)`, `layout = read_layout(path, size, footer, columns,
  max_rows=, max_bytes=)`, `index = ParquetFileIndex.from_layout(layout)`. The planner
  uses `index.row_starts` (rows per row group), `index.locate(rows)` and
  `index.fetch_ranges(g)` (the selected columns' coalesced byte ranges) as it uses an
  ArrayRecord file's chunk table. A worker needs the footer's bytes (to parse it once per
  file) and the layout.
- decode step (a worker, per row group): the fetched ranges (offset -> bytes), then
  `RowGroupDecoder(layout, footer.meta).table(g, fetched, max_bytes=)` gives a `pyarrow.Table`,
  and `rows(table, i, j)` / `take_rows(table, indices)` the wanted rows as elements. A
  worker parses a file's footer once and keeps one decoder per file (and thread) for that
  file's row groups; `decode_row_group` is the one-off form.

Errors are `ParquetFormatError` (also `aioloader.ParquetFormatError`), naming the
file, row group and column.
"""

from .decode import RowGroupDecoder, decode_row_group
from .errors import ParquetFormatError
from .fileindex import ParquetFileIndex, coalesce
from .footer import (
    TAIL_BYTES,
    ParquetFooter,
    footer_from_tail,
    footer_range,
    parse_footer,
    tail_range,
)
from .layout import ColumnChunk, ParquetLayout, RowGroupLayout, read_layout
from .rows import column_values, rows, take_rows

__all__ = ["TAIL_BYTES", "ColumnChunk", "ParquetFileIndex", "ParquetFooter", "ParquetFormatError",
           "ParquetLayout", "RowGroupDecoder", "RowGroupLayout", "coalesce", "column_values",
           "decode_row_group", "footer_from_tail", "footer_range", "parse_footer",
           "read_layout", "rows", "tail_range", "take_rows"]
