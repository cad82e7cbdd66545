"""The sync face of a record source: `src[i]`, slices, batched fetches, iteration, `with`,
pickling as its configuration.

Each runs the source's own coroutines on the shared background loop (`aioloader.io.sync`), so
it works in scripts and in notebooks that run their own loop; `close` lets the loop go once
the last source that used it is closed. The async source (`ArrayRecordSource`) provides what
is read; this class only carries it across (one record alone goes through `_record`, which a
source may answer without the loop).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from ..arrayrecord import ChunkRecords
from ..io.sync import close_sync, release, run_sync

_S = TypeVar("_S", bound="SyncReads")


class SyncReads:
    """The sync API over a source's `read`, `read_chunks`, `aclose` and `_require_open`;
    `_config` is what a copy in another process opens again."""

    _config: dict[str, Any]
    _used_sync: bool = False

    # -- what the source provides ----------------------------------------------------

    def __len__(self) -> int:
        raise NotImplementedError

    def _require_open(self) -> None:
        raise NotImplementedError

    async def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        raise NotImplementedError

    async def read_chunks(self, files: Any, chunks: Any) -> dict[tuple[int, int], ChunkRecords]:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    # -- sync API ---------------------------------------------------------------------

    def read_chunk(self, file: int, chunk: int) -> ChunkRecords:
        """All records of one chunk of one file (sync)."""
        self._require_open()
        return self._sync(self.read_chunks([file], [chunk]))[(file, chunk)]

    def __getitem__(self, key: Any) -> Any:
        self._require_open()  # a failed open lets the background loop go
        if isinstance(key, slice):
            return self._sync(self.read(range(*key.indices(len(self)))))
        if isinstance(key, (list, tuple, np.ndarray, range)):
            return self._sync(self.read(key))
        i = int(key)
        if i < 0:
            i += len(self)
        return self._record(i)

    def _record(self, i: int) -> bytes:
        """Record `i` alone (a source may read it without the loop)."""
        return self._sync(self.read([i]))[0]

    def __getitems__(self, keys: Sequence[int]) -> list[bytes]:
        """The records at `keys` in one call (Grain's and PyTorch's batched fetch)."""
        return self[list(keys)]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its configuration: a copy (a Grain or PyTorch worker process) opens
        the files again, lazily, on first use."""
        return dict(self._config)

    def __setstate__(self, config: dict[str, Any]) -> None:
        self.__init__(**config)  # type: ignore[misc]

    def __iter__(self) -> Iterator[bytes]:
        n = len(self)
        step = 4096
        for lo in range(0, n, step):
            yield from self[lo : min(n, lo + step)]

    # -- closing ----------------------------------------------------------------------

    def _sync(self, coro: Coroutine[Any, Any, Any]) -> Any:
        self._used_sync = True
        return run_sync(coro, user=self)

    def close(self, wait: bool = True) -> None:
        """Release the I/O resources the sync API used (and the background loop, if last);
        `wait=False` only starts that (a finalizer's close: see `close_sync`)."""
        if not self._used_sync:
            return
        self._used_sync = False
        try:
            close_sync(self.aclose(), wait=wait)
        finally:  # a failed close (or open) still lets the background loop go
            release(self)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
