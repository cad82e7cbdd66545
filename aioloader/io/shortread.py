"""The error for a read that came back the wrong length (the file shrank since it was opened,
or the server ignored the byte range), apart from `aioloader.storage` so that worker
processes, which read local files themselves, raise it without loading the storage layer
(asyncio, the object-store clients): a worker's start-up is the first batch's wait."""

from __future__ import annotations

from ..errors import StorageError
from ..urls import redact


def short_read_error(url: str, start: int, end: int, got: int) -> StorageError:
    """A read that came back short (the file shrank since it was opened), or long: more
    bytes than asked for means the server sent something else than the range (an HTTP
    server that ignores `Range` answers 200 with the whole object)."""
    if got > end - start:
        return StorageError(
            f"{redact(url)}: asked for bytes [{start}, {end}), got {got}: the server ignored "
            "the byte range (it sent more than asked for, likely the whole object); serve "
            "the file from a server that answers HTTP Range requests (206 Partial Content)")
    return StorageError(f"{redact(url)}: asked for bytes [{start}, {end}), got {got} (the file "
                        "is shorter than when it was opened: re-open it)")
