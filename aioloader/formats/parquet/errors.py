"""The one error type for malformed or over-budget Parquet input.

Like `ArrayRecordFormatError`, every message names where the problem is (file, row group,
column, byte offset) and what to do about it, so that a traceback from a worker process
points at one object in one bucket. A `ValueError`: bad input, as for the other formats.
"""

from __future__ import annotations

CORRUPT_HINT = "the file is corrupted or was not fully written; re-create or re-upload it"
BUDGET_HINT = "raise max_rows/max_bytes (the loader's memory_budget), or rewrite the file " \
              "with smaller row groups"


class ParquetFormatError(ValueError):
    """Malformed, truncated, unsupported or over-budget Parquet data."""

    def __init__(self, what: str, *, path: str | None = None, row_group: int | None = None,
                 column: str | None = None, offset: int | None = None,
                 hint: str | None = None) -> None:
        self.what = what
        self.path = path
        self.row_group = row_group
        self.column = column
        self.offset = offset
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = [str(self.path)] if self.path is not None else []
        if self.row_group is not None:
            where.append(f"row group {self.row_group}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        text = f"{', '.join(where)}: {self.what}" if where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return text

    def __reduce__(self):  # keep the fields across process boundaries
        return (_rebuild, (self.what, self.path, self.row_group, self.column, self.offset,
                           self.hint))


def _rebuild(what, path, row_group, column, offset, hint) -> ParquetFormatError:
    return ParquetFormatError(what, path=path, row_group=row_group, column=column,
                              offset=offset, hint=hint)
