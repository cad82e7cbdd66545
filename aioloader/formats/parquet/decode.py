"""A row group decoded from its fetched column chunks into a pyarrow Table (the columnar
result batching uses; `rows.py` turns it into elements).

The worker holds the file's parsed footer and a row group's fetched ranges (offset ->
bytes). Before pyarrow sees a byte, each selected chunk must be wholly among the fetched
bytes and its page headers must agree with the chunk and fit the memory budget
(`pages.walk_pages`); pyarrow then reads the chunks through a `FetchedFile`, which refuses
any other read. Whatever pyarrow raises on a damaged page becomes a `ParquetFormatError`
naming the file, row group and column, as does a decoded row count that is not the one
declared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .budget import decoded_bound
from .errors import BUDGET_HINT, CORRUPT_HINT, ParquetFormatError
from .fetched import FetchedFile, NotFetchedError
from .footer import pyarrow_parquet
from .layout import ParquetLayout
from .pages import PageError, walk_pages

__all__ = ["decode_row_group"]


def decode_row_group(layout: ParquetLayout, meta: Any, group: int,
                     fetched: Mapping[int, bytes | memoryview], *,
                     max_bytes: int) -> Any:
    """Row group `group` of the file `layout` describes, as a `pyarrow.Table` of the
    selected columns (in `layout.columns`' order), from `fetched`: offset -> bytes, holding
    at least the chunks `layout` names for it (`ParquetFileIndex.fetch_ranges`). `meta` is
    the file's parsed footer (`parse_footer`); `max_bytes` bounds what the selected
    chunks may decode to (`budget.decoded_bound`)."""
    if not 0 <= group < len(layout.row_groups):
        raise IndexError(f"{layout.path}: row group {group} of {len(layout.row_groups)}")
    path, rg = layout.path, layout.row_groups[group]
    if rg.num_rows == 0:  # no bytes to read: its chunks are empty (`read_layout` checks)
        return _empty(layout, meta)
    try:
        file = FetchedFile(path, layout.size, fetched)
    except ValueError as e:
        raise ParquetFormatError(str(e), path=path, row_group=group) from None
    walks = []
    for c in rg.chunks:
        try:
            view = file.view(c.offset, c.end)
            walks.append((c, walk_pages(view, c.num_values, max_decompressed=max_bytes), view))
        except NotFetchedError as e:
            raise ParquetFormatError(f"its bytes [{e.start}, {e.stop}) were not fetched",
                                     path=path, row_group=group, column=c.path,
                                     hint="fetch the ranges its index names") from None
        except PageError as e:
            raise ParquetFormatError(str(e), path=path, row_group=group, column=c.path,
                                     offset=c.offset + e.offset,
                                     hint=BUDGET_HINT if e.budget else CORRUPT_HINT
                                     ) from None
    _check_budget(path, group, walks, max_bytes)
    table = _read(layout, meta, group, file)
    if table.num_rows != rg.num_rows:
        raise ParquetFormatError(f"decodes to {table.num_rows} rows, its footer declares "
                                 f"{rg.num_rows}", path=path, row_group=group,
                                 hint=CORRUPT_HINT)
    return table if list(layout.columns) == table.column_names \
        else table.select(list(layout.columns))


def _check_budget(path: str, group: int, walks: list, max_bytes: int) -> None:
    """The chunks' decoded bounds against `max_bytes`: first the cheap ones, then, only if
    they do not fit, with each dictionary's longest entry read."""
    bounds = [decoded_bound(c, t, v, exact_dictionary=False) for c, t, v in walks]
    if sum(bounds) <= max_bytes:
        return
    total = 0
    for c, totals, view in walks:
        try:
            total += decoded_bound(c, totals, view, exact_dictionary=True)
        except PageError as e:
            raise ParquetFormatError(str(e), path=path, row_group=group, column=c.path,
                                     offset=c.offset + e.offset, hint=CORRUPT_HINT) from None
        if total > max_bytes:
            raise ParquetFormatError(
                f"its pages decode to more than the {max_bytes} bytes the memory budget "
                f"allows ({total} bytes with this column's)", path=path, row_group=group,
                column=c.path, hint=BUDGET_HINT)


def _empty(layout: ParquetLayout, meta: Any) -> Any:
    schema = meta.schema.to_arrow_schema()
    return schema.empty_table().select(list(layout.columns))


def _read(layout: ParquetLayout, meta: Any, group: int, file: FetchedFile) -> Any:
    pq = pyarrow_parquet()
    import pyarrow as pa

    try:
        # pre_buffer off: coalescing would read the gaps between the selected chunks.
        reader = pq.ParquetFile(file, metadata=meta, pre_buffer=False).reader
        return reader.read_row_group(group, column_indices=list(layout.leaves),
                                     use_threads=False)
    except (pa.ArrowException, OSError, ValueError, IndexError, OverflowError) as e:
        if file.misses:  # pyarrow asked for bytes outside the chunks the layout names
            start, stop = file.misses[0]
            raise ParquetFormatError(f"decoding it read bytes [{start}, {stop}), which were "
                                     "not fetched", path=layout.path, row_group=group,
                                     hint=CORRUPT_HINT) from None
        raise ParquetFormatError(f"its pages do not decode: {e}", path=layout.path,
                                 row_group=group, hint=CORRUPT_HINT) from None
