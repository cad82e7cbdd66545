"""A Parquet chunk's records: the rows of the row group whose range (`parquetindex`) a
fetched chunk holds, as record bytes (`parquetrows`).

Decoding needs the file's footer (the schema, the column chunks' places) where the other
formats' chunks describe themselves: `ParquetChunks` is built from the footer's bytes and
the selected columns (what opening read), parses them once, and keeps one
`parquet.RowGroupDecoder` for the file, so it is for one thread at a time. A chunk is found
by its start offset, which must be a row group's (`parquetindex.chunk_table`); its rows
are checked against the count the index holds, and every declared size by the Parquet
layer before pyarrow decodes a byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .parquet.decode import RowGroupDecoder
from .parquet.errors import CORRUPT_HINT, ParquetFormatError
from .parquet.footer import parse_footer
from .parquet.layout import read_layout
from .parquetrows import rows_as_bytes

__all__ = ["ParquetChunks"]


class ParquetChunks:
    """The row groups of one Parquet file, decoded from their chunks' bytes."""

    def __init__(self, path: str, size: int, footer: bytes, columns: Sequence[str] | None,
                 *, max_decoded: int) -> None:
        parsed = parse_footer(path, size, footer, max_bytes=max_decoded)
        self.layout = read_layout(path, size, parsed, columns, max_rows=max_decoded,
                                  max_bytes=max_decoded)
        self._decoder = RowGroupDecoder(self.layout, parsed.meta)
        self._groups = {min(c.offset for c in rg.chunks if c.length): g
                        for g, rg in enumerate(self.layout.row_groups)
                        if any(c.length for c in rg.chunks)}

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
