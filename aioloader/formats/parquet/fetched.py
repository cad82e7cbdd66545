"""A Parquet file as a worker holds it: its size, and only the byte ranges it fetched.

pyarrow's reader wants a file; a worker has a row group's column chunks (and the footer,
already parsed). `FetchedFile` is a read-only, seekable file-like object of the file's full
size that serves the fetched ranges, as views of the fetched bytes (no copy), and raises on
any read of bytes it was not given: a read outside what was fetched is a bug or a lying
file, never garbage handed to the decoder.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

__all__ = ["FetchedFile", "NotFetchedError"]


class NotFetchedError(ValueError):
    """A read of bytes that were not fetched: `start`, `stop` say which."""

    def __init__(self, path: str, start: int, stop: int) -> None:
        super().__init__(f"{path}: bytes [{start}, {stop}) were not fetched")
        self.start, self.stop = start, stop


class FetchedFile:
    """A file of `size` bytes of which only `pieces` (offset -> bytes) exist."""

    def __init__(self, path: str, size: int, pieces: Mapping[int, bytes | memoryview]) -> None:
        self.path, self.size = path, size
        self.pos = 0
        self.closed = False
        self.reset(pieces)

    def reset(self, pieces: Mapping[int, bytes | memoryview]) -> None:
        """Serve `pieces` (offset -> bytes) from now on, and nothing else."""
        path, size = self.path, self.size
        self.misses: list[tuple[int, int]] = []  # reads refused, for the caller's message
        starts = sorted(pieces)
        self._starts = starts
        self._views = [memoryview(pieces[s]).cast("B") for s in starts]
        self._ends = [s + len(v) for s, v in zip(starts, self._views)]
        for s, prev in zip(starts[1:], self._ends):
            if s < prev:
                raise ValueError(f"{path}: fetched ranges overlap at byte {s}")
        if starts and (starts[0] < 0 or self._ends[-1] > size):
            raise ValueError(f"{path}: fetched ranges pass the file's {size} bytes")

    def view(self, start: int, stop: int) -> memoryview | bytes:
        """Bytes [start, stop): a view when one piece holds them, joined when adjacent
        pieces do; `NotFetchedError` otherwise."""
        if start == stop:
            return b""
        i = bisect.bisect_right(self._starts, start) - 1
        parts, at = [], start
        while 0 <= i < len(self._starts) and self._starts[i] <= at < self._ends[i]:
            first, end = self._starts[i], min(stop, self._ends[i])
            parts.append(self._views[i][at - first:end - first])
            at, i = end, i + 1
            if at == stop:
                return parts[0] if len(parts) == 1 else b"".join(parts)
        self.misses.append((start, stop))
        raise NotFetchedError(self.path, start, stop)

    # -- the file protocol pyarrow's PythonFile uses
    def read(self, n: int = -1) -> memoryview | bytes:
        stop = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        data = self.view(self.pos, stop)
        self.pos = stop
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 \
            else self.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
