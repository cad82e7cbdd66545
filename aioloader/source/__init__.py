"""Records of ArrayRecord (or TFRecord: `aioloader.formats`) files by global index: locate
(`table`), fetch (`fetch`), and the user-facing `ArrayRecordSource` / `TFRecordSource`
(`api`) over the two."""

from .api import ArrayRecordSource, TFRecordSource, recorded_spec
from .fetch import Fetcher, RawChunkCache
from .records import ChunkCache
from .table import RecordTable

__all__ = ["ArrayRecordSource", "ChunkCache", "Fetcher", "RawChunkCache", "RecordTable",
           "TFRecordSource", "recorded_spec"]
