"""The decoded multi-record chunks one decoding process keeps (`ChunkCache`): a byte-bounded
LRU by where a chunk's bytes lie, which a block shuffle or a sequential read, whose next
tasks ask for the same chunks again, hits; and how a task's records are told to share
chunks (`chunk_keys`). A chunk is kept as bytes and Python ints, so a record is one slice
and nothing keeps a view of the arena or of a map that later tasks reuse.
"""

from __future__ import annotations

from collections import OrderedDict

from ..arrayrecord import ChunkRecords
from ..index.planning import ChunkRefs

__all__ = ["BOUND_BYTES", "Chunk", "ChunkCache", "chunk_keys", "unpacked"]

Chunk = tuple[bytes, list[int]]  # a decoded chunk: record j is data[bounds[j]:bounds[j + 1]]
BOUND_BYTES = 40  # what the cache counts for each record's bound (a Python int in a list)


def unpacked(records: ChunkRecords) -> Chunk:
    """A decoded chunk as bytes and Python ints: a record is then one slice, no view made
    (and no view kept of the arena or a map, which later tasks reuse)."""
    values = records.values
    obj = values.obj
    data = obj if type(obj) is bytes and len(obj) == len(values) else bytes(values)
    return data, records.bounds.tolist()


class ChunkCache:
    """Decoded multi-record chunks by where their bytes lie (path or URL, offset), least
    recently used out first, bounded in bytes (their data, and `BOUND_BYTES` a record for
    the bounds)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple[str, int], tuple[Chunk, int]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> Chunk | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: tuple[str, int], chunk: Chunk) -> None:
        size = len(chunk[0]) + BOUND_BYTES * len(chunk[1])
        if size > self.max_bytes or key in self._items:
            return
        self._items[key] = (chunk, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)


def chunk_keys(refs: ChunkRefs) -> list[tuple[int, int]] | None:
    """Each record's chunk as (file, start), for spotting records that share one; None when
    every chunk holds one record (group size 1: records share chunks only by repeating)."""
    if refs.count is None or not len(refs) or int(refs.count.max()) <= 1:
        return None
    return list(zip(refs.file.tolist(), refs.start.tolist()))


