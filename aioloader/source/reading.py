"""What `ArrayRecordSource` reads for its user: records by index, decoded (`read`, one
record alone in the caller's thread: `_record`), and a failed read explained (`explain`: a
file rewritten since it was opened, or a stale index cache entry, told apart from damage).

A mixin over the source's opened stages (`table`, `fetcher`, its caches and storage): the
source owns opening and fetching, this the records' way to the user.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..arrayrecord import ArrayRecordFormatError, ChunkRecords
from ..cache.index_cache import IndexCache
from ..errors import ObjectChangedError
from ..io.storage import Storage, StorageError, redact
from .direct import DirectReads
from .fetch import Fetcher
from .opening import footer_changed
from .records import ChunkCache, read_chunks
from .syncreads import SyncReads
from .table import RecordTable


class DecodedReads(SyncReads):
    """Records by index, decoded, and read errors explained, for a source that provides the
    attributes below once open."""

    storage: Storage
    verify: str
    cache: ChunkCache
    _table: RecordTable | None
    _index_cache: IndexCache | None
    _direct: DirectReads | None

    @property
    def table(self) -> RecordTable:
        raise NotImplementedError

    @property
    def fetcher(self) -> Fetcher:
        raise NotImplementedError

    async def aopen(self) -> None:
        raise NotImplementedError

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    async def explain(self, err: Exception, files) -> Exception:
        """`err`, or an `ObjectChangedError` if one of `files` changed since it was opened.

        A corrupt record read through an index cache entry drops the entry (the next open
        rebuilds it), once, and the files' footers are read again: one that no longer
        matches its cached index was rewritten unseen, not damaged."""
        table, cache = self._table, self._index_cache
        if (isinstance(err, ArrayRecordFormatError) and cache is not None
                and table is not None and table.from_index_cache):
            table.from_index_cache = False
            cache.drop(table.files, f"a record read through it failed ({err})", table.formats)
            for f in sorted(files):
                info = table.files[f]
                if await footer_changed(self.storage, info, table.indices[f], self.verify,
                                        table.formats[f]):
                    return ObjectChangedError(
                        f"{redact(info.url)} was rewritten after its index was cached in "
                        f"{cache.directory} (its size and mtime kept), so the cached index "
                        f"did not fit it ({err}); the entry was dropped: re-open the dataset")
        return await self.fetcher.explain(err, files)

    # -- reading ----------------------------------------------------------------------

    async def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The records at `indices`, in that order."""
        await self.aopen()
        files, chunks, within = self.locate(indices)
        decoded = await self.read_chunks(files, chunks)
        return [decoded[(f, c)].record(j)
                for f, c, j in zip(files.tolist(), chunks.tolist(), within.tolist())]

    async def read_chunks(self, files, chunks) -> dict[tuple[int, int], ChunkRecords]:
        """Fetch and decode the distinct (file, chunk) pairs named; each read once."""
        await self.aopen()
        try:
            return await read_chunks(self.table, self.fetcher, self.cache, files, chunks,
                                     verify=self.verify,
                                     max_decoded=self.storage.max_inflight_bytes)
        except (ArrayRecordFormatError, StorageError) as err:
            raise await self.explain(err, set(np.asarray(files).tolist())) from None

    def _record(self, i: int) -> bytes:
        """Record `i` alone: read in this thread when its file is local or its chunk
        decoded already (`direct`), with the errors `read` raises; else on the loop."""
        f, c, j = self.table.locate_one(i)
        try:
            got = self._direct.record(f, c, j)  # type: ignore[union-attr]  # open: made
        except (ArrayRecordFormatError, StorageError) as err:
            raise self._sync(self.explain(err, {f})) from None
        return got if got is not None else super()._record(i)
