"""The one error type for malformed ArrayRecord input.

Every message names where the problem is (file, chunk, byte offset) and, when there is one,
what to do about it, so that a user staring at a traceback from a worker process knows which
object in which bucket to look at.
"""

from __future__ import annotations


class ArrayRecordFormatError(ValueError):
    """Malformed, truncated or unsupported ArrayRecord data."""

    def __init__(
        self,
        what: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        chunk: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.path = path
        self.offset = offset
        self.chunk = chunk
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.chunk is not None:
            where.append(f"chunk {self.chunk}")
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        text = f"{', '.join(where)}: {self.what}" if where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return text

    def located(
        self, *, path: str | None = None, chunk: int | None = None
    ) -> ArrayRecordFormatError:
        """Return a copy with the file (and chunk) filled in where they were unknown."""
        return ArrayRecordFormatError(
            self.what,
            path=self.path if self.path is not None else path,
            offset=self.offset,
            chunk=self.chunk if self.chunk is not None else chunk,
            hint=self.hint,
        )

    def __reduce__(self):  # keep the fields across process boundaries
        return (_rebuild, (self.what, self.path, self.offset, self.chunk, self.hint))


def _rebuild(what, path, offset, chunk, hint) -> ArrayRecordFormatError:
    return ArrayRecordFormatError(what, path=path, offset=offset, chunk=chunk, hint=hint)


CORRUPT_HINT = "the file is corrupted or was not fully written; re-create or re-upload it"
