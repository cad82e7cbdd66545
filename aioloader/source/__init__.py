"""Records of ArrayRecord files by global index: locate (`table`), fetch (`fetch`), and the
user-facing `ArrayRecordSource` (`api`) over the two."""

from .api import ArrayRecordSource, recorded_spec
from .fetch import Fetcher, RawChunkCache
from .records import ChunkCache
from .table import RecordTable

__all__ = ["ArrayRecordSource", "ChunkCache", "Fetcher", "RawChunkCache", "RecordTable",
           "recorded_spec"]
