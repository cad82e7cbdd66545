"""The one error type for malformed ArrayRecord input.

Every message names where the problem is (file, chunk, byte offset) and, when there is one,
what to do about it, so that a user staring at a traceback from a worker process knows which
object in which bucket to look at.
"""

from __future__ import annotations


class ArrayRecordFormatError(ValueError):
    """Malformed, truncated or unsupported ArrayRecord data.

    The other formats' errors subclass it (every layer that handles a damaged file then
    handles theirs), naming their own unit where ArrayRecord says "chunk" (`UNIT`)."""

    UNIT = "chunk"

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

    def _where(self) -> list[str]:
        """Where the problem is, most general first."""
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.chunk is not None:
            where.append(f"{self.UNIT} {self.chunk}")
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        return where

    def _render(self) -> str:
        where = self._where()
        text = f"{', '.join(where)}: {self.what}" if where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return text

    def _fields(self) -> dict:
        return {"path": self.path, "offset": self.offset, "chunk": self.chunk,
                "hint": self.hint}

    def located(
        self, *, path: str | None = None, chunk: int | None = None
    ) -> ArrayRecordFormatError:
        """Return a copy with the file (and chunk) filled in where they were unknown."""
        fields = self._fields()
        fields["path"] = self.path if self.path is not None else path
        fields["chunk"] = self.chunk if self.chunk is not None else chunk
        return type(self)(self.what, **fields)

    def __reduce__(self):  # keep the type and the fields across process boundaries
        return (_rebuild, (type(self), self.what, self._fields()))


def _rebuild(cls: type[ArrayRecordFormatError], what: str,
             fields: dict) -> ArrayRecordFormatError:
    return cls(what, **fields)


CORRUPT_HINT = "the file is corrupted or was not fully written; re-create or re-upload it"
