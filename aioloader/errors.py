"""The public error types aioloader raises, in one leaf module (the formats' own: see below).

A leaf so that any layer can raise these without importing a higher one: it imports nothing
from aioloader but `ArrayRecordFormatError`, which lives with the format layer below
(`aioloader.arrayrecord.errors`) because that layer must not depend on this package. The
other formats' errors (`TFRecordFormatError`, `ParquetFormatError`) live with their formats
(`aioloader.formats`) and are public names of the package (`aioloader.ParquetFormatError`).
The modules that raise an error also re-export it under its old name (`aioloader.storage.
StorageError`, `aioloader.describe.state.StateError`, ...), so either import works.

Each subclasses the built-in error a caller would already catch for the same failure:
`ValueError` for bad input, `OSError` for storage, `RuntimeError` for a failure while running.
"""

from __future__ import annotations

from .arrayrecord.errors import ArrayRecordFormatError

__all__ = [
    "ArrayRecordFormatError",
    "CollateError",
    "ConvertError",
    "ElementSpecError",
    "MissingExtraError",
    "ObjectChangedError",
    "StateError",
    "StorageError",
    "StoreUnavailableError",
    "TransformError",
    "WorkerError",
]


class StorageError(OSError):
    """A range read or lookup that failed for good (after retries, or not retriable)."""


class ObjectChangedError(StorageError, FileNotFoundError):
    """A file or object was rewritten or deleted after it was opened."""


class StoreUnavailableError(StorageError, TimeoutError):
    """The store kept failing or did not answer within the retry policy's deadline."""


class StateError(ValueError):
    """A loader state that cannot be resumed from; the message names the field."""


class TransformError(RuntimeError):
    """A user transform raised; the message names the op, the record and the cause."""


class CollateError(ValueError):
    """batch() cannot stack the elements: the message names the field and the element.

    `element` is the offending element's place in the batch, so that whoever knows which
    record that is (the worker) can name it too.
    """

    def __init__(self, message: str, element: int | None = None) -> None:
        super().__init__(message)
        self.element = element


class ElementSpecError(ValueError):
    """A record does not fit its element spec, or a spec is malformed: says what and where."""


class WorkerError(RuntimeError):
    """A worker process died, or could not send its result back; the message says why."""


class ConvertError(ValueError):
    """Unreadable input: names the file, the byte offset or row, and what is wrong.

    The message is redacted whole: an input may be a signed URL."""

    def __init__(self, message: str) -> None:
        # Imported here, not at the top, to keep this module a leaf (`urls` is one too).
        from .urls import redact

        super().__init__(redact(message))


class MissingExtraError(ImportError):
    """A feature needs an optional dependency that is not installed: one line naming the
    extra that brings it (``pip install 'aioloader[gcs]'``). An `ImportError`, so code that
    already catches that still does."""

    def __init__(self, extra: str, feature: str, missing: str | None = None) -> None:
        because = f" (no module named {missing!r})" if missing else ""
        super().__init__(f"{feature} needs the '{extra}' extra{because}: "
                         f"pip install 'aioloader[{extra}]'", name=missing)
        self.extra = extra


class Transient(Exception):
    """Internal: a storage attempt's failure worth retrying (`aioloader.retry` retries it;
    users see a `StorageError`); `cause` is what the error message reports."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class Unreachable(Transient):
    """Internal: an attempt that could not connect at all (no such host, connection refused,
    no route). Retried briefly only: these rarely heal within a read's deadline, and waiting
    hides the cause."""
