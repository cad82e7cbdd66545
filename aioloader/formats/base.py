"""`RecordFormat`: what the loader needs of a record format, and nothing more.

Two things differ between formats: how a file's chunk table (`FileIndex`) is built from its
bytes, and how one chunk's bytes become records. Both are sans-I/O, as ArrayRecord's opening
is: `open_index` is a generator that yields `(offset, length)` read requests and is sent the
bytes, so one driver serves local preads and object-store range reads alike
(`source.opening`); decoding takes the bytes a chunk's range holds. The rest (the record
table, planning, fetching, the cache tiers, the workers) sees only chunk ranges and counts.

A format whose chunks do not describe themselves (Parquet: the schema and the column
chunks' places are in the file's footer) is `contextual`: opening puts what decoding needs
in the index (`FileIndex.context`, opaque bytes the format writes and reads), and a
decoding process turns it into its per-file state once (`prepare`), keeps that, and hands
it to every decode of that file's chunks (`states` / `state`). Tasks carry only which
file each record is of; the context travels to a worker once (`workers.decode`).

The few other members say what a cached index of the format must satisfy
(`index_limits`, `proof_offset`: `cache.index_cache`) and how to describe one file
(`codec`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # (types only: naming a format loads no codec)
    from ..arrayrecord.chunk import ChunkRecords
    from ..arrayrecord.fileindex import FileIndex

ReadRequest = tuple[int, int]
IndexSteps = Generator[ReadRequest, "bytes | memoryview", "FileIndex"]


class RecordFormat(Protocol):
    """One record format: its chunk table from a file's bytes, its records from a chunk's."""

    name: str
    contextual: bool  # decoding needs each file's context (`prepare`)
    # whether the stash of large chunks (`workers.extract`) can pull its records out: an
    # exact shuffle over large chunks of other formats decodes each chunk per task instead
    stashable: bool
    # the mean decoded bytes of a file's chunks from which an exact shuffle's records go
    # through the stash (`runtime.horizons`): below it each task decodes its chunks
    stash_from: int
    # whether several decoding processes share one decode of a chunk through the stash even
    # where each could keep every chunk (a decode costs far more than the stash's copy)
    stash_shared: bool

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
                       max_decoded: int, states: Sequence[Any] | None = None) -> list[Any]:
        """Record `within[i]` of the chunk whose range's bytes `raws[i]` start at file
        offset `starts[i]`, for every i (`paths[i]`, `chunks[i]` name it in errors;
        `counts[i]` is the index's record count of that chunk; `states[i]` its file's
        `prepare`d state, for a contextual format). A record is `bytes`, or the element
        itself for a format whose records are not bytes (a Parquet row: a dict)."""
        ...

    def decode_chunk(self, raw, start: int, *, verify: str, path: str | None,
                     chunk: int | None, expected_records: int | None,
                     max_decoded: int, state: Any = None) -> ChunkRecords:
        """Every record of the chunk whose range's bytes `raw` start at `start`."""
        ...

    def stash_records(self, raw, start: int, wanted: Sequence[int], *, verify: str,
                      path: str | None, chunk: int | None, expected_records: int | None,
                      max_decoded: int, state: Any = None
                      ) -> tuple[bytes, Iterable[bytes]]:
        """Records `wanted` (sorted, distinct) of the chunk whose bytes `raw` start at
        `start`, as the stash keeps them: the entry's head (what its records share, kept
        once; may be empty) and each record's bytes, in order, made as they are consumed
        (the stash stops at the first that does not fit)."""
        ...

    def from_stash(self, data: bytes | memoryview, head: bytes | memoryview = b"") -> Any:
        """The record `stash_records` made `data` of, in an entry of head `head`."""
        ...

    def kept_bytes(self, max_decoded: int) -> int | None:
        """The decoded bytes of chunks a decoding process keeps for its next tasks, where
        the format keeps its decoded chunks itself (under `max_decoded`, the memory
        budget); None: they are kept in its share of the decoded-chunk cache."""
        ...

    def prepare(self, context: bytes, *, path: str | None, max_decoded: int) -> Any:
        """A contextual format's state for one file, from its index's `context` (checked
        as any input is: bad bytes raise the format's error naming `path`)."""
        ...

    def index_limits(self, size: int) -> tuple[int, int]:
        """(the least offset a chunk may start at, the most the index's end offset
        (`footer_offset`) may be) in a file of `size` bytes."""
        ...

    def proof_offset(self, index: FileIndex) -> int:
        """Where the bytes lie that tie a cached index to a file's content where its version
        does not (`cache.index_cache.HEAD_BYTES` of them from here, fewer at the end)."""
        ...

    def check_cached(self, index: FileIndex) -> None:
        """Raise ValueError where an index read back from the index cache disagrees with
        what its file's context (a contextual format's) says of its chunks."""
        ...

    def codec(self, index: FileIndex) -> str:
        """How the file's chunks are compressed, in a word ("zstd:3", "none")."""
        ...
