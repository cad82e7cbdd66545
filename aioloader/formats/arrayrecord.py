"""ArrayRecord as a `RecordFormat`: a thin adapter over `aioloader.arrayrecord`, which stays
the pure format package (it knows nothing of this interface).

Opening is `arrayrecord.open_index` (small reads for a local file, one speculative read of
the footer's likely span for a remote one); decoding is its `decode_records` /
`decode_chunk`. The workers keep their own faster paths for ArrayRecord's one-record chunks
(`workers.ones`) and large multi-record chunks (`workers.extract`); what they cannot serve
comes here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .bytesrecords import BytesRecords

if TYPE_CHECKING:
    from ..arrayrecord.chunk import ChunkRecords
    from ..arrayrecord.fileindex import FileIndex
    from .base import IndexSteps

# A chunk starts after the file's signature chunk; the footer lies before the postscript.
_FIRST_CHUNK = 64


class ArrayRecordFormat(BytesRecords):
    """ArrayRecord files (Riegeli chunks, a footer of chunk offsets, a postscript)."""

    name = "arrayrecord"
    contextual = False
    stashable = True
    stash_from = 1 << 20  # (a chunk decodes fast: only large ones are worth the stash)
    stash_shared = False

    def open_index(self, size: int, *, path: str | None, verify: str, max_decoded: int,
                   local: bool, span: int | None = None) -> IndexSteps:
        from ..arrayrecord.index import open_index

        return open_index(size, path=path, verify=verify, max_decoded=max_decoded,
                          small_reads=local, span=None if local else span)

    def decode_records(self, raws: Sequence, starts: Sequence[int], within: Sequence[int], *,
                       verify: str, paths: Sequence[str | None] | None,
                       chunks: Sequence[int | None] | None, counts: Sequence[int] | None,
                       max_decoded: int, states: Sequence[Any] | None = None) -> list[bytes]:
        from ..arrayrecord.decoding import decode_records

        return decode_records(raws, starts, within, verify=verify, paths=paths, chunks=chunks,
                              counts=counts, max_decoded=max_decoded)

    def decode_chunk(self, raw, start: int, *, verify: str, path: str | None,
                     chunk: int | None, expected_records: int | None,
                     max_decoded: int, state: Any = None) -> ChunkRecords:
        from ..arrayrecord.decoding import decode_chunk

        return decode_chunk(raw, start, verify=verify, path=path, chunk=chunk,
                            expected_records=expected_records, max_decoded=max_decoded,
                            whole_range=True)[1]

    def stash_records(self, raw, start: int, wanted: Sequence[int], *, verify: str,
                      path: str | None, chunk: int | None, expected_records: int | None,
                      max_decoded: int, state: Any = None
                      ) -> tuple[bytes, Iterable[bytes]]:
        """(the workers pull ArrayRecord records out themselves, streamed: `workers.extract`)"""
        records = self.decode_chunk(raw, start, verify=verify, path=path, chunk=chunk,
                                    expected_records=expected_records,
                                    max_decoded=max_decoded)
        return b"", (bytes(records.record(j)) for j in wanted)

    def index_limits(self, size: int) -> tuple[int, int]:
        return _FIRST_CHUNK, size - 1  # (the footer lies before the postscript's block)

    def proof_offset(self, index: FileIndex) -> int:
        return index.footer_offset  # the footer chunk's header, with its hash

    def check_cached(self, index: FileIndex) -> None:
        """(no context: the cache's own checks are all there is)"""

    def codec(self, index: FileIndex) -> str:
        c = index.options.compression if index.options is not None else None
        if c is None:
            return "unknown"
        return c.name if c.level is None or c.name not in ("zstd", "brotli") else \
            f"{c.name}:{c.level}"


FORMAT = ArrayRecordFormat()
