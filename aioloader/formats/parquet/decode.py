"""A row group decoded from its fetched column chunks into a pyarrow Table (the columnar
result batching uses; `rows.py` turns it into elements).

The worker holds the file's parsed footer and a row group's fetched ranges (offset ->
bytes). Before pyarrow sees a byte, each selected chunk must be wholly among the fetched
bytes, its page headers must agree with the chunk (`pages.walk_pages`), and what they
decode to must fit the memory budget (`budget.decoded_bound`); pyarrow then reads the
chunks through a `FetchedFile`, which refuses any other read. Whatever pyarrow raises on a
damaged page becomes a `ParquetFormatError` naming the file and row group, as does a
decoded row count that is not the one declared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .budget import decoded_bound
from .errors import BUDGET_HINT, CORRUPT_HINT, ParquetFormatError
from .fetched import FetchedFile, NotFetchedError
from .footer import pyarrow_parquet
from .layout import VALUE_COST, ParquetLayout
from .pages import PageError, walk_pages

__all__ = ["RowGroupDecoder", "decode_row_group"]


def decode_row_group(layout: ParquetLayout, meta: Any, group: int,
                     fetched: Mapping[int, bytes | memoryview], *,
                     max_bytes: int) -> Any:
    """One row group's Table by a fresh `RowGroupDecoder` (a worker keeps one per file)."""
    return RowGroupDecoder(layout, meta).table(group, fetched, max_bytes=max_bytes)


class RowGroupDecoder:
    """Decodes the row groups of one file. It keeps pyarrow's reader, opened once over a
    `FetchedFile` whose bytes each call replaces (opening one costs about as much as
    decoding a thousand short rows), so it is for one thread at a time."""

    def __init__(self, layout: ParquetLayout, meta: Any) -> None:
        self.layout, self.meta = layout, meta
        self._file = FetchedFile(layout.path, layout.size, {})
        self._reader: Any = None

    def table(self, group: int, fetched: Mapping[int, bytes | memoryview], *,
              max_bytes: int) -> Any:
        """Row group `group` as a `pyarrow.Table` of the selected columns (in
        `layout.columns`' order), from `fetched`: offset -> bytes, holding at least the
        chunks the layout names for it (`ParquetFileIndex.fetch_ranges`). `max_bytes` bounds
        what the selected chunks may decode to (`budget.decoded_bound`)."""
        layout = self.layout
        if not 0 <= group < len(layout.row_groups):
            raise IndexError(f"{layout.path}: row group {group} of {len(layout.row_groups)}")
        path, rg = layout.path, layout.row_groups[group]
        if rg.num_rows == 0:  # no bytes to read: its chunks are empty (`read_layout` checks)
            return _empty(layout, self.meta)
        try:
            self._file.reset(fetched)
        except ValueError as e:
            raise ParquetFormatError(str(e), path=path, row_group=group) from None
        walks = []
        for c in rg.chunks:
            try:
                view = self._file.view(c.offset, c.end)
                walks.append((c, walk_pages(view, c.num_values, max_decompressed=max_bytes,
                                                 width=c.width), view))
            except NotFetchedError as e:
                raise ParquetFormatError(f"its bytes [{e.start}, {e.stop}) were not fetched",
                                         path=path, row_group=group, column=c.path,
                                         hint="fetch the ranges its index names") from None
            except PageError as e:
                raise ParquetFormatError(str(e), path=path, row_group=group, column=c.path,
                                         offset=c.offset + e.offset,
                                         hint=BUDGET_HINT if e.budget else CORRUPT_HINT
                                         ) from None
        batch_rows = _check_budget(path, group, walks, max_bytes)
        try:
            table = self._read(group, batch_rows, max_bytes)
        finally:
            self._file.reset({})  # the fetched bytes are not kept past the call
        if table.num_rows != rg.num_rows:
            raise ParquetFormatError(f"decodes to {table.num_rows} rows, its footer declares "
                                     f"{rg.num_rows}", path=path, row_group=group,
                                     hint=CORRUPT_HINT)
        _check_valid(path, group, table)
        return table if list(layout.columns) == table.column_names \
            else table.select(list(layout.columns))

    def _read(self, group: int, batch_rows: int | None, max_bytes: int) -> Any:
        """The row group at once, or (`batch_rows`) in batches of that many rows, refused
        as soon as they pass `max_bytes`."""
        pq = pyarrow_parquet()
        import pyarrow as pa

        layout, file = self.layout, self._file
        try:
            if self._reader is None:
                # pre_buffer off: coalescing would read the gaps between the chunks.
                self._reader = pq.ParquetFile(file, metadata=self.meta,
                                              pre_buffer=False).reader
            if batch_rows is None:
                return self._reader.read_row_group(group, column_indices=list(layout.leaves),
                                                   use_threads=False)
            batches, sizes = [], [0] * len(layout.columns)
            for batch in self._reader.iter_batches(batch_rows, [group],
                                                   column_indices=list(layout.leaves),
                                                   use_threads=False):
                sizes = [n + c.nbytes for n, c in zip(sizes, batch.columns)]
                if sum(sizes) > max_bytes:
                    break
                batches.append(batch)
            else:
                return pa.Table.from_batches(batches)
        except (pa.ArrowException, OSError, ValueError, IndexError, OverflowError) as e:
            if file.misses:  # pyarrow asked for bytes outside the chunks the layout names
                start, stop = file.misses[0]
                raise ParquetFormatError(f"decoding it read bytes [{start}, {stop}), which "
                                         "were not fetched", path=layout.path,
                                         row_group=group, hint=CORRUPT_HINT) from None
            raise ParquetFormatError(f"its pages do not decode: {e}", path=layout.path,
                                     row_group=group, hint=CORRUPT_HINT) from None
        name = batch.schema.names[sizes.index(max(sizes))]
        raise ParquetFormatError(
            f"its pages decode to more than the {max_bytes} bytes the memory budget allows "
            "(DELTA_BYTE_ARRAY values, counted as they decode)", path=layout.path,
            row_group=group, column=name, hint=BUDGET_HINT)


def _check_valid(path: str, group: int, table: Any) -> None:
    """pyarrow's reader does not check that strings are UTF-8: a damaged string page would
    fail later, in whatever converts it, naming no file."""
    import pyarrow as pa

    for name, column in zip(table.column_names, table.columns):
        try:
            column.validate(full=True)
        except (pa.ArrowException, ValueError) as e:
            raise ParquetFormatError(f"its values do not decode to valid data: {e}",
                                     path=path, row_group=group, column=name,
                                     hint=CORRUPT_HINT) from None


def _check_budget(path: str, group: int, walks: list, max_bytes: int) -> int | None:
    """The chunks' decoded bounds against `max_bytes`: first the cheap ones, then, only if
    they do not fit, with each dictionary's longest entry read. None: they fit. A number:
    they fit but for DELTA_BYTE_ARRAY values (whose bound, each value as long as all the
    suffixes before it, is far above what real pages decode to) of columns holding one
    value a row: decode batches of that many rows, which take at most a quarter of the
    budget each, and count what they take."""
    bounds = [decoded_bound(c, t, v, exact_dictionary=False) for c, t, v in walks]
    if sum(bounds) <= max_bytes:
        return None
    deltas = [(c, t) for c, t, _ in walks if t.delta_bound]
    delta = sum(t.delta_bound for _, t in deltas)
    total = 0
    for c, totals, view in walks:
        try:
            total += decoded_bound(c, totals, view, exact_dictionary=True)
        except PageError as e:
            raise ParquetFormatError(str(e), path=path, row_group=group, column=c.path,
                                     offset=c.offset + e.offset, hint=CORRUPT_HINT) from None
        if total - delta > max_bytes or (total > max_bytes and any(
                d.repeated for d, _ in deltas)):
            raise ParquetFormatError(
                f"its pages decode to more than the {max_bytes} bytes the memory budget "
                f"allows ({total} bytes with this column's)", path=path, row_group=group,
                column=c.path, hint=BUDGET_HINT)
    if total <= max_bytes:
        return None
    per_row = sum(t.delta_longest for _, t in deltas) + VALUE_COST * len(walks)
    return max(1, max_bytes // 4 // per_row)


def _empty(layout: ParquetLayout, meta: Any) -> Any:
    schema = meta.schema.to_arrow_schema()
    return schema.empty_table().select(list(layout.columns))
