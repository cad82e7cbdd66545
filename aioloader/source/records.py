"""Decoded records for the user's view of a source (`ArrayRecordSource.read`, `src[i]`).

Each needed chunk is fetched (through the fetch stage) and decoded once, and the decoded
chunks of files with group size > 1 stay in a byte-bounded LRU (`ChunkCache`): `src[i]` one
record at a time then costs one decompression per chunk, not one per record (the fetcher's
raw cache would save only the download; this path bypasses it, so a chunk is not held
twice). The loader does not come here: its workers decode.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict

import numpy as np

from .. import formats as fmts
from ..arrayrecord import ChunkRecords
from .fetch import Fetcher
from .table import RecordTable

_DECODE_IN_THREAD_BYTES = 1 << 20  # more than this to decode: off the event loop's thread


class ChunkCache:
    """Decoded chunks, least recently used out first, bounded in bytes; safe across threads
    (`src[i]` of local files reads in the caller's thread, `read` on the loop's)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[tuple[int, int], ChunkRecords] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> ChunkRecords | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(key)
            return item

    def put(self, key: tuple[int, int], records: ChunkRecords) -> None:
        size = len(records.values)
        with self._lock:
            if size > self.max_bytes or key in self._items:
                return
            self._items[key] = records
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self.bytes -= len(old.values)


async def read_chunks(table: RecordTable, fetcher: Fetcher, cache: ChunkCache, files, chunks,
                      *, verify: str, max_decoded: int) -> dict[tuple[int, int], ChunkRecords]:
    """The distinct (file, chunk) pairs named, decoded; each fetched and decoded once."""
    keys = sorted(set(zip(np.asarray(files).tolist(), np.asarray(chunks).tolist())))
    grouped = table.grouped
    out: dict[tuple[int, int], ChunkRecords] = {}
    missing = []
    for key in keys:
        hit = cache.get(key) if grouped[key[0]] else None
        if hit is None:
            missing.append(key)
        else:
            out[key] = hit
    if not missing:
        return out
    raw = await fetcher.fetch_chunks(missing)
    work = [(key, *raw[key]) for key in missing]

    def decode_all() -> list[ChunkRecords]:
        decoded = []
        for (f, c), data, start in work:
            index = table.indices[f]
            records = fmts.get(table.formats[f]).decode_chunk(
                data, start, verify=verify, path=index.path, chunk=c,
                expected_records=int(index.chunk_records[c]), max_decoded=max_decoded,
                state=table.state(f, max_decoded))
            decoded.append(records)
        return decoded

    if sum(len(w[1]) for w in work) > _DECODE_IN_THREAD_BYTES:
        decoded = await asyncio.to_thread(decode_all)
    else:
        decoded = decode_all()
    for key, records in zip(missing, decoded):
        if grouped[key[0]]:
            cache.put(key, records)
        out[key] = records
    return out
