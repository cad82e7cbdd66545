"""`RecordFormat`: what the loader needs of a record format, and nothing more.

Two things differ between formats: how a file's chunk table (`FileIndex`) is built from its
bytes, and how one chunk's bytes become records. Both are sans-I/O, as ArrayRecord's opening
is: `open_index` is a generator that yields `(offset, length)` read requests and is sent the
bytes, so one driver serves local preads and object-store range reads alike
(`source.opening`); decoding takes the bytes a chunk's range holds. The rest (the record
table, planning, fetching, the cache tiers, the workers) sees only chunk ranges and counts.

The few other members say what a cached index of the format must satisfy
(`index_limits`, `proof_offset`: `cache.index_cache`) and how to describe one file
(`codec`).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # (types only: naming a format loads no codec)
    from ..arrayrecord.chunk import ChunkRecords
    from ..arrayrecord.fileindex import FileIndex

ReadRequest = tuple[int, int]
IndexSteps = Generator[ReadRequest, "bytes | memoryview", "FileIndex"]


class RecordFormat(Protocol):
    """One record format: its chunk table from a file's bytes, its records from a chunk's."""

    name: str

    def open_index(self, size: int, *, path: str | None, verify: str, max_decoded: int,
                   local: bool, span: int | None = None) -> IndexSteps:
        """The file's chunk table, from the reads it yields. `local`: round trips are
        cheap (small reads are fine); `span`: how much a remote file's first read may take
        (a hint). Declared sizes are checked against `size` and `max_decoded` before
        anything is allocated; bad input raises an `ArrayRecordFormatError` (or a subclass)
        naming the file and where."""
        ...

    def decode_records(self, raws: Sequence, starts: Sequence[int], within: Sequence[int], *,
                       verify: str, paths: Sequence[str | None] | None,
                       chunks: Sequence[int | None] | None, counts: Sequence[int] | None,
                       max_decoded: int) -> list[bytes]:
        """Record `within[i]` of the chunk whose range's bytes `raws[i]` start at file
        offset `starts[i]`, for every i (`paths[i]`, `chunks[i]` name it in errors;
        `counts[i]` is the index's record count of that chunk)."""
        ...

    def decode_chunk(self, raw, start: int, *, verify: str, path: str | None,
                     chunk: int | None, expected_records: int | None,
                     max_decoded: int) -> ChunkRecords:
        """Every record of the chunk whose range's bytes `raw` start at `start`."""
        ...

    def index_limits(self, size: int) -> tuple[int, int]:
        """(the least offset a chunk may start at, the most the index's end offset
        (`footer_offset`) may be) in a file of `size` bytes."""
        ...

    def proof_offset(self, index: FileIndex) -> int:
        """Where the bytes lie that tie a cached index to a file's content where its version
        does not (`cache.index_cache.HEAD_BYTES` of them from here, fewer at the end)."""
        ...

    def codec(self, index: FileIndex) -> str:
        """How the file's chunks are compressed, in a word ("zstd:3", "none")."""
        ...
