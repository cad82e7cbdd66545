"""`src[i]` of a local file: one record read and decoded in the caller's thread.

Grain's samplers, and many users, ask for one record at a time. Through `read` each such
call pays a round trip to the background loop and a hop to its read threads, which costs
far more than what the record needs: a page-cache `pread` of its chunk and a decode. Here
the chunk is located with scalar lookups (`RecordTable.locate_one`), read with one `pread`
on a descriptor of the process's shared set (`aioloader.io.descriptors`: pinned to the
file the source opened under its path), and decoded by the decoding of its file's format
(`aioloader.formats`) that the batched path uses, with its checks: the byte budget before
the read, a short read, the footer's record count, the chunk filling its range, the hashes
`verify` asks for. Multi-record chunks go through the source's decoded-chunk cache, shared
with `read`, so a chunk is decoded once whichever way its records are asked for.

Errors are raised as `read` raises them, before `ArrayRecordSource` explains them (a file
changed since it was opened). Files on remote stores are not read here: their reads stay on
the loop, where the retries, the hedges and the memory tier are; only a record of a chunk
already decoded (the cache) is answered here for them too, as `read` would answer it.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import formats as fmts
from ..io.backends import local_ident
from ..io.descriptors import FileSet
from ..io.shortread import short_read_error
from ..urls import is_local
from .records import ChunkCache
from .table import RecordTable


class DirectReads:
    """One record at a time (`record`) of a local file, or of a decoded chunk, from any
    thread."""

    def __init__(self, table: RecordTable, cache: ChunkCache, *, verify: str,
                 max_decoded: int, check_budget: Callable[[str, int, int], None]) -> None:
        self.table = table
        self.cache = cache
        self.verify = verify
        self.max_decoded = max_decoded
        self._check_budget = check_budget  # the storage's: one read over the budget refused
        urls = table.urls
        self.local = [is_local(u) for u in urls]
        self._paths = [u.removeprefix("file://") for u in urls]
        self._grouped = table.grouped.tolist()
        self._formats = [fmts.get(name) for name in table.formats]  # each file's decoding
        # Pinned to the files the table opened (their versions name device and inode): a
        # file replaced at its path since (a rename) is refused, never read.
        pins = {path: ident for path, info, local in zip(self._paths, table.files, self.local)
                if local and (ident := local_ident(info.version)) is not None}
        self._files = FileSet(pins=pins)

    def record(self, file: int, chunk: int, within: int) -> bytes | None:
        """Record `within` of chunk `chunk` of file `file` (as `locate_one` gives); None
        when the file is remote and the chunk not decoded yet (`read` reads it)."""
        grouped = self._grouped[file]
        if grouped:
            hit = self.cache.get((file, chunk))
            if hit is not None:
                return hit.record(within)
        if not self.local[file]:
            return None
        index = self.table.indices[file]
        start, end = index.chunk_range(chunk)
        count = int(index.chunk_records[chunk])
        url = self.table.urls[file]
        self._check_budget(url, start, end)
        raw = self._files.pread(self._paths[file], end - start, start)
        if len(raw) != end - start:
            raise short_read_error(url, start, end, len(raw))
        fmt = self._formats[file]
        state = self.table.state(file, self.max_decoded)
        if not grouped:  # one-record chunks: the inline decoder (not cached, as in `read`)
            return fmt.decode_records([raw], [start], [within], verify=self.verify,
                                      paths=[index.path], chunks=[chunk], counts=[count],
                                      max_decoded=self.max_decoded, states=[state])[0]
        records = fmt.decode_chunk(raw, start, verify=self.verify, path=index.path,
                                   chunk=chunk, expected_records=count,
                                   max_decoded=self.max_decoded, state=state)
        self.cache.put((file, chunk), records)
        return records.record(within)

    def close(self) -> None:
        """Let the descriptors this reader used go (those no other reader is using)."""
        self._files.close()
