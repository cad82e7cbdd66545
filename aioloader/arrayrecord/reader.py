"""Random access to one file's records through a blocking `fetch(offset, length)`.

The caller owns the I/O (a local pread, an fsspec file); this module only decides which byte
ranges to ask for and decodes them. Each chunk a request needs is fetched and decoded once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .chunk import ChunkRecords
from .decoding import decode_chunk
from .fileindex import FileIndex
from .index import DEFAULT_TAIL, _check_verify, read_index
from .levels import DEFAULT_MAX_DECODED, DEFAULT_VERIFY

Fetch = Callable[[int, int], bytes]


class RangeReader:
    """Records of one ArrayRecord file, read by byte ranges.

    `max_decoded` is the most bytes one chunk (or the footer) may decode to: a declared size
    beyond it is an `ArrayRecordFormatError` before anything is allocated.
    """

    def __init__(
        self,
        fetch: Fetch,
        size: int,
        *,
        path: str | None = None,
        verify: str = DEFAULT_VERIFY,
        index: FileIndex | None = None,
        tail: int = DEFAULT_TAIL,
        max_decoded: int = DEFAULT_MAX_DECODED,
    ) -> None:
        _check_verify(verify)
        self._fetch = fetch
        self.path = path
        self.verify = verify
        self.max_decoded = max_decoded
        self.index = index or read_index(size, fetch, path=path, verify=verify, tail=tail,
                                         max_decoded=max_decoded)

    def __len__(self) -> int:
        return self.index.num_records

    def read_chunk(self, chunk: int) -> ChunkRecords:
        """Fetch and decode one data chunk."""
        start, end = self.index.chunk_range(chunk)
        raw = self._fetch(start, end - start)
        _, records = decode_chunk(raw, start, verify=self.verify, path=self.path, chunk=chunk,
                                  expected_records=int(self.index.chunk_records[chunk]),
                                  max_decoded=self.max_decoded, whole_range=True)
        return records

    def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """Records at `indices`, in the order asked (each needed chunk read once)."""
        chunks, local = self.index.locate(indices)
        out: list[bytes] = [b""] * len(chunks)
        order = np.argsort(chunks, kind="stable")
        current, records = -1, None
        for k in order.tolist():
            c = int(chunks[k])
            if c != current:
                current, records = c, self.read_chunk(c)
            out[k] = records.record(int(local[k]))  # type: ignore[union-attr]
        return out

    def __getitem__(self, i: int) -> bytes:
        return self.read([i])[0]

    def __iter__(self):
        for c in range(self.index.num_chunks):
            yield from self.read_chunk(c).records()
