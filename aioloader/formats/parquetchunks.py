"""A Parquet chunk's records: the rows of the row group whose range (`parquetindex`) a
fetched chunk holds, as record bytes (`parquetrows`).

Decoding needs the file's footer (the schema, the column chunks' places) where the other
formats' chunks describe themselves: `ParquetChunks` is built from the footer's bytes and
the selected columns (what opening read), parses them once, and keeps one
`parquet.RowGroupDecoder` for the file, so it is for one thread at a time. A chunk is found
by its start offset, which must be a row group's (`parquetindex.chunk_table`); its rows
are checked against the count the index holds, and every declared size by the Parquet
layer before pyarrow decodes a byte.

What opening hands the workers for a file is its *context* (`pack_context`): the file's
size, the selected columns and the footer's bytes, a few KiB that go into the index (and
the index cache) once; a worker builds its `ParquetChunks` from it once per file
(`from_context`). A decoding process asks one row group for many rows in turn: the row
groups it decoded last are kept, with their columns as values once rows were taken (`KEPT`:
one bound for the process, all files together, a quarter of the memory budget; always the
last one), so the rows of one row group that a task or the next few ask for cost one decode.
"""

from __future__ import annotations

import itertools
import json
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

from .parquet.decode import RowGroupDecoder
from .parquet.errors import CORRUPT_HINT, ParquetFormatError
from .parquet.footer import parse_footer
from .parquet.layout import read_layout
from .parquetrows import rows_as_bytes, rows_for_stash

__all__ = ["ParquetChunks", "pack_context", "unpack_context"]

_MAGIC = b"PQX1"
_HEAD = struct.Struct("<4sQI")  # magic, the file's size, the columns' JSON length


def pack_context(size: int, columns: Sequence[str], footer: bytes) -> bytes:
    """A file's context: its size, the selected columns and its footer's bytes (the
    footer's thrift, its length and the closing magic, as `parse_footer` takes them)."""
    names = json.dumps(list(columns)).encode()
    return _HEAD.pack(_MAGIC, size, len(names)) + names + footer


def unpack_context(path: str, context: bytes | memoryview
                   ) -> tuple[int, tuple[str, ...], bytes]:
    """(size, columns, footer) of a context `pack_context` made; a `ParquetFormatError`
    naming `path` for bytes that are not one."""
    data = bytes(context)
    try:
        magic, size, n = _HEAD.unpack_from(data)
        if magic != _MAGIC or _HEAD.size + n > len(data):
            raise ValueError("not a Parquet file's context")
        columns = json.loads(data[_HEAD.size : _HEAD.size + n])
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise ValueError("its columns are not a list of names")
    except (struct.error, ValueError) as e:
        raise ParquetFormatError(f"the index's context does not decode ({e})", path=path,
                                 hint="re-open the file (remove its index cache entry)"
                                 ) from None
    return size, tuple(columns), data[_HEAD.size + n :]


Raw: TypeAlias = bytes | memoryview | Callable[[], bytes | memoryview]  # (bytes, or how)


class _Kept:
    """A decoded row group kept: its Table, its columns as values once rows were taken
    (`values`), and what it is counted as (`cost`)."""

    __slots__ = ("cost", "table", "values")

    def __init__(self, table: Any) -> None:
        self.table, self.cost = table, table.nbytes
        self.values: list[list[Any]] | None = None


class KeptRowGroups:
    """Decoded row groups of every file of this process by (file's decoder, start), least
    recently used out past the bound (the last one put stays)."""

    def __init__(self) -> None:
        self._items: OrderedDict[tuple[int, int], _Kept] = OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> _Kept | None:
        with self._lock:
            kept = self._items.get(key)
            if kept is not None:
                self._items.move_to_end(key)
            return kept

    def put(self, key: tuple[int, int], kept: _Kept, max_bytes: int, *,
            grown: int = 0) -> None:
        """`kept` in (its cost `grown` bytes more: its values converted), then the oldest
        out until the bound holds. Its cost changes under the lock eviction takes, and one
        evicted meanwhile by another thread comes back with its whole cost counted."""
        with self._lock:
            kept.cost += grown
            if key not in self._items:
                self._items[key] = kept
                self.bytes += kept.cost
            else:
                self.bytes += grown
            while len(self._items) > 1 and self.bytes > max_bytes:
                _, old = self._items.popitem(last=False)
                self.bytes -= old.cost

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


KEPT = KeptRowGroups()
_IDS = itertools.count()


class ParquetChunks:
    """The row groups of one Parquet file, decoded from their chunks' bytes."""

    def __init__(self, path: str, size: int, footer: bytes, columns: Sequence[str] | None,
                 *, max_decoded: int) -> None:
        parsed = parse_footer(path, size, footer, max_bytes=max_decoded)
        self.layout = read_layout(path, size, parsed, columns, max_rows=max_decoded,
                                  max_bytes=max_decoded)
        self.meta = parsed.meta  # (pyarrow's FileMetaData: codecs, statistics)
        self._decoder = RowGroupDecoder(self.layout, parsed.meta)
        self._groups = {min(c.offset for c in rg.chunks if c.length): g
                        for g, rg in enumerate(self.layout.row_groups)
                        if any(c.length for c in rg.chunks)}
        self._lock = threading.Lock()  # (a source's reads may come from several threads)
        self._id = next(_IDS)  # this decoder's row groups in `KEPT`
        self.decoded = 0  # row groups decoded (not found kept)

    @classmethod
    def from_context(cls, path: str, context: bytes | memoryview, *,
                     max_decoded: int) -> ParquetChunks:
        """The decoder of the file whose context (`pack_context`) is `context`."""
        size, columns, footer = unpack_context(path, context)
        return cls(path, size, footer, columns, max_decoded=max_decoded)

    def kept_table(self, raw: Raw, start: int, *, max_decoded: int,
                   expected_records: int | None = None) -> Any:
        """`table`, or the one kept from an earlier call for the same row group. `raw` may
        be a function that gives the bytes: called only when the row group is not kept."""
        with self._lock:
            return self._kept_one(raw, start, max_decoded, expected_records).table

    def rows(self, raw: Raw, start: int, within: Sequence[int], *, max_decoded: int,
             expected_records: int | None = None) -> list[dict[str, Any]]:
        """Rows `within` (any order, repeats allowed) of that row group, as elements: the
        kept row group's columns are converted to values once (`parquet.rows`), and each
        row is then a dict of them."""
        with self._lock:
            kept = self._kept_one(raw, start, max_decoded, expected_records)
            if kept.values is None:
                from .parquet.rows import column_values, values_cost

                kept.values = [column_values(c) for c in kept.table.columns]
                # (the Table is counted already: the values' objects, and their copies of
                # strings' and bytes' data)
                grown = sum(values_cost(c) for c in kept.table.columns)
                KEPT.put((self._id, start), kept, max_decoded // 4, grown=grown)
            names, values, n = kept.table.column_names, kept.values, kept.table.num_rows
        out = []
        for j in within:
            j = int(j)
            if not 0 <= j < n:
                raise ParquetFormatError(f"row {j} asked of a row group of {n}",
                                         path=self.layout.path,
                                         row_group=self._groups.get(start), hint=CORRUPT_HINT)
            out.append(dict(zip(names, [v[j] for v in values])))
        return out

    def _kept_one(self, raw: Raw, start: int, max_decoded: int,
                  expected_records: int | None) -> _Kept:
        kept = KEPT.get((self._id, start))
        if kept is not None:
            rows = kept.table.num_rows
            if expected_records is not None and expected_records != rows:
                raise ParquetFormatError(f"holds {rows} rows where its index has "
                                         f"{expected_records}", path=self.layout.path,
                                         row_group=self._groups.get(start), hint=CORRUPT_HINT)
            return kept
        table = self.table(raw() if callable(raw) else raw, start, max_decoded=max_decoded,
                           expected_records=expected_records)
        self.decoded += 1
        kept = _Kept(table)
        KEPT.put((self._id, start), kept, max_decoded // 4)
        return kept

    def table(self, raw: bytes | memoryview, start: int, *, max_decoded: int,
              expected_records: int | None = None) -> Any:
        """The row group whose chunk's bytes `raw` start at file offset `start`, decoded
        (a `pyarrow.Table` of the selected columns)."""
        path = self.layout.path
        group = self._groups.get(start)
        if group is None:
            raise ParquetFormatError(f"no row group's selected bytes start at {start} (the "
                                     "file changed after it was indexed?)", path=path,
                                     offset=start, hint=CORRUPT_HINT)
        rows = self.layout.row_groups[group].num_rows
        if expected_records is not None and expected_records != rows:
            raise ParquetFormatError(f"holds {rows} rows where its index has "
                                     f"{expected_records}", path=path, row_group=group,
                                     hint=CORRUPT_HINT)
        return self._decoder.table(group, {start: raw}, max_bytes=max_decoded)

    def records(self, raw: bytes | memoryview, start: int, within: Sequence[int], *,
                max_decoded: int, expected_records: int | None = None) -> list[bytes]:
        """Rows `within` of that row group, each as a record's bytes."""
        table = self.table(raw, start, max_decoded=max_decoded,
                           expected_records=expected_records)
        return rows_as_bytes(table, within)

    def stashed(self, raw: bytes | memoryview, start: int, within: Sequence[int], *,
                max_decoded: int, expected_records: int | None = None
                ) -> tuple[bytes, Iterator[bytes]]:
        """Rows `within` of that row group as the stash keeps them (`parquetrows.
        rows_for_stash`: the entry's head, its rows made one at a time): the row group kept
        (`KEPT`) if it is, else decoded and not kept (a horizon wants each row once)."""
        with self._lock:
            if KEPT.get((self._id, start)) is not None:
                table = self._kept_one(raw, start, max_decoded, expected_records).table
            else:
                table = self.table(raw, start, max_decoded=max_decoded,
                                   expected_records=expected_records)
                self.decoded += 1
        return rows_for_stash(table, within)
