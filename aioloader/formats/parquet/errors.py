"""The one error type for malformed or over-budget Parquet input.

Like `ArrayRecordFormatError`, every message names where the problem is (file, row group,
column, byte offset) and what to do about it, so that a traceback from a worker process
points at one object in one bucket. An `ArrayRecordFormatError` (a `ValueError`), as every
format's damaged file is.
"""

from __future__ import annotations

from ...arrayrecord.errors import ArrayRecordFormatError

CORRUPT_HINT = "the file is corrupted or was not fully written; re-create or re-upload it"
BUDGET_HINT = "raise max_rows/max_bytes (the loader's memory_budget), or rewrite the file " \
              "with smaller row groups"


class ParquetFormatError(ArrayRecordFormatError):
    """Malformed, truncated, unsupported or over-budget Parquet data (an
    `ArrayRecordFormatError`, as every format's damaged file is; its "chunk" is the row
    group, and it may name a column)."""

    UNIT = "row group"

    def __init__(self, what: str, *, path: str | None = None, row_group: int | None = None,
                 column: str | None = None, offset: int | None = None,
                 hint: str | None = None, chunk: int | None = None) -> None:
        self.column = column
        super().__init__(what, path=path, offset=offset,
                         chunk=row_group if row_group is not None else chunk, hint=hint)

    @property
    def row_group(self) -> int | None:
        return self.chunk

    def _where(self) -> list[str]:
        where = super()._where()
        if self.column is not None:  # after the row group, before the byte
            where.insert(len(where) - (self.offset is not None), f"column {self.column!r}")
        return where

    def _fields(self) -> dict:
        return {**super()._fields(), "column": self.column}
