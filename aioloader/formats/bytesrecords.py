"""Defaults shared by the formats whose records are their bytes (ArrayRecord, TFRecord).

(Not in `formats.base`: importing that module at run time would set the package's `base`
attribute, which is the function `formats.base`, to the module.)"""

from __future__ import annotations

from typing import Any


class BytesRecords:
    """What formats whose records are their bytes and whose files need no context (ArrayRecord,
    TFRecord) do alike: a stashed record is its bytes, their decoded chunks are kept in the
    decoded-chunk cache, and there is no context to prepare."""

    name: str

    def from_stash(self, data: bytes | memoryview, head: bytes | memoryview = b"") -> bytes:
        return bytes(data)

    def kept_bytes(self, max_decoded: int) -> int | None:
        return None

    def prepare(self, context: bytes, *, path: str | None, max_decoded: int) -> Any:
        raise TypeError(f"{self.name} files need no context to decode")
