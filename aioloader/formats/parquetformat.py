"""Parquet as a `RecordFormat`: a record is a row (a dict column -> value), a chunk a row group.

Opening is `parquetindex.open_index` (the footer from one speculative tail read, a second
read only for a longer footer): a chunk per row group, its range from its first selected
column chunk to the next row group, and the file's context (footer and selected columns,
`parquetchunks.pack_context`). The format is contextual: a decoding process builds its
`ParquetChunks` from a file's context once (`prepare`) and decodes every row group of the
file with it, so the footer is parsed once per process, not per task.

A record is the row itself, not bytes: `decode_records` gives the rows as the Parquet layer
gives them (`parquet.rows`), so no row is pickled on its way to the transforms. Only where
an exact shuffle shares one decode of each row group among tasks through the stash
(`runtime.horizons`) is a row serialized once there (`stash_records`) and read back for its
task (`from_stash`). A format kind names the columns read (`formats.reading("parquet", ["a",
"b"])`): `selecting` is the format reading those.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .parquet.errors import ParquetFormatError
from .parquetrows import row_from_stash

if TYPE_CHECKING:
    from ..arrayrecord.fileindex import FileIndex
    from .base import IndexSteps
    from .parquetchunks import ParquetChunks

_MAGIC = 4  # "PAR1" opens the file: a row group's first column chunk starts after it
_TRAILER = 8  # the footer's length and the closing "PAR1"
_PROOF = 64  # the file's last bytes tie a cached index to its content
_KEPT_PER_DECODED = 2  # a kept row group's bytes (Table and values) per decoded byte


class RowGroupRecords:
    """A decoded row group as the user-facing source keeps it (as an ArrayRecord chunk's
    `ChunkRecords`): `record(j)` is row j; `values` is sized as its decoded bytes (what a
    byte-bounded cache counts)."""

    def __init__(self, chunks: ParquetChunks, table: Any) -> None:
        self._chunks, self.table = chunks, table
        self.values = range(table.nbytes)  # (only its length is used: the bytes it holds)

    def __len__(self) -> int:
        return self.table.num_rows

    def record(self, j: int) -> dict[str, Any]:
        from .parquet.rows import take_rows

        return take_rows(self.table, [j])[0]


class ParquetFormat:
    """Parquet files, reading `columns` (None: all)."""

    name = "parquet"
    contextual = True
    stashable = True
    # a row group's decode (pages to Arrow to Python values) costs microseconds a row: an
    # exact shuffle shares one decode of each row group a horizon, among all its workers
    stash_from = 64 << 10
    stash_shared = True

    def __init__(self, columns: Sequence[str] | None = None) -> None:
        self.columns = None if columns is None else tuple(columns)

    def selecting(self, columns: Sequence[str]) -> ParquetFormat:
        """This format reading only `columns`."""
        return ParquetFormat(columns)

    def open_index(self, size: int, *, path: str | None, verify: str, max_decoded: int,
                   local: bool, span: int | None = None) -> IndexSteps:
        from .parquetindex import open_index

        return open_index(size, path=path, max_decoded=max_decoded, columns=self.columns)

    def prepare(self, context: bytes, *, path: str | None, max_decoded: int) -> ParquetChunks:
        from .parquetchunks import ParquetChunks

        name = path if path is not None else "<parquet>"
        if not context:
            raise ParquetFormatError("its index has no context (footer) to decode it by",
                                     path=name, hint="re-open the file")
        return ParquetChunks.from_context(name, context, max_decoded=max_decoded)

    def decode_records(self, raws: Sequence, starts: Sequence[int], within: Sequence[int], *,
                       verify: str, paths: Sequence[str | None] | None,
                       chunks: Sequence[int | None] | None, counts: Sequence[int] | None,
                       max_decoded: int, states: Sequence[Any] | None = None
                       ) -> list[dict[str, Any]]:
        if states is None or len(states) != len(raws):
            raise TypeError("Parquet records decode by their files' states (prepare)")
        groups: dict[tuple[int, int], list[int]] = {}  # (file's state, chunk) -> records
        for i, (state, start) in enumerate(zip(states, starts)):
            groups.setdefault((id(state), start), []).append(i)
        out: list[Any] = [None] * len(raws)
        for idx in groups.values():
            i = idx[0]
            got = states[i].rows(lambda i=i: raws[i], starts[i], [within[k] for k in idx],
                                 max_decoded=max_decoded,
                                 expected_records=None if counts is None else counts[i])
            for k, row in zip(idx, got):
                out[k] = row
        return out

    def decode_chunk(self, raw, start: int, *, verify: str, path: str | None,
                     chunk: int | None, expected_records: int | None,
                     max_decoded: int, state: Any = None) -> Any:
        if state is None:
            raise TypeError("a Parquet chunk decodes by its file's state (prepare)")
        table = state.kept_table(raw, start, max_decoded=max_decoded,
                                 expected_records=expected_records)
        return RowGroupRecords(state, table)

    def stash_records(self, raw, start: int, wanted: Sequence[int], *, verify: str,
                      path: str | None, chunk: int | None, expected_records: int | None,
                      max_decoded: int, state: Any = None
                      ) -> tuple[bytes, Iterator[bytes]]:
        """The rows `wanted` of the row group as the stash keeps them
        (`parquetrows.rows_for_stash`): the entry's head, and its rows one at a time."""
        if state is None:
            raise TypeError("a Parquet chunk decodes by its file's state (prepare)")
        return state.stashed(raw, start, wanted, max_decoded=max_decoded,
                             expected_records=expected_records)

    def from_stash(self, data: bytes | memoryview, head: bytes | memoryview = b""
                   ) -> dict[str, Any]:
        return row_from_stash(data, head)

    def kept_bytes(self, max_decoded: int) -> int | None:
        """A decoding process keeps row groups in a quarter of the budget
        (`parquetchunks.KEPT`), each counted as its Table and its values, which take about
        its decoded bytes again (strings copied, numbers as objects)."""
        return max_decoded // 4 // _KEPT_PER_DECODED

    def index_limits(self, size: int) -> tuple[int, int]:
        return _MAGIC, size - _TRAILER

    def proof_offset(self, index: FileIndex) -> int:
        return max(0, index.size - _PROOF)  # the footer's end, its length and magic

    def check_cached(self, index: FileIndex) -> None:
        """The chunk table the index's footer (its context) gives must be the index's: a
        cached entry's row counts are believed only where the footer says so."""
        import numpy as np

        from .parquetindex import chunk_table

        state = self.prepare(index.context, path=index.path, max_decoded=1 << 62)
        want = chunk_table(state.layout, path=index.path)
        if not (np.array_equal(want.chunk_offsets, index.chunk_offsets)
                and np.array_equal(want.chunk_records, index.chunk_records)):
            raise ValueError("its chunks or row counts are not the row groups its footer "
                             "describes")

    def codec(self, index: FileIndex) -> str:
        """The selected column chunks' codecs ("snappy", "zstd+gzip"), from the footer."""
        if not index.context or not index.num_chunks:
            return "none"
        state = self.prepare(index.context, path=index.path, max_decoded=1 << 62)
        leaves = state.layout.leaves
        meta = state.meta
        names = {meta.row_group(g).column(c).compression.lower()
                 for g in range(meta.num_row_groups) for c in leaves}
        return "+".join(sorted(names)).replace("uncompressed", "none") or "none"


FORMAT = ParquetFormat()
