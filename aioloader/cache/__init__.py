"""The tiers between the bucket and the workers: the memory tier (`segments`: segments of a
remote dataset in one memory file, bounded in bytes, fetched ahead where upcoming records
lie densely, `readahead`, `keeping`), and the disk tier under it (`disk`: entries, `budget`:
their bytes, `tier`: segments, `download`: getting them there). Which tier serves a task is
the byte path's decision (`aioloader.source.bytepath`).

The names below load on first use: worker processes import `cache.entry` (to read disk tier
entries) and must not load the parent's side (asyncio, storage) with it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .readahead import dense_segments
    from .segments import SEGMENT_BYTES, FetchSegment, SegmentStore

__all__ = ["SEGMENT_BYTES", "FetchSegment", "SegmentStore", "dense_segments"]
_HOMES = {"dense_segments": ".readahead", "SEGMENT_BYTES": ".segments",
          "FetchSegment": ".segments", "SegmentStore": ".segments"}


def __getattr__(name: str) -> object:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
