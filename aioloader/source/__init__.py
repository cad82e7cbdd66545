"""Records of ArrayRecord (or TFRecord, Parquet: `aioloader.formats`) files by global
index: locate (`table`), fetch (`fetch`), and the user-facing `ArrayRecordSource` (`api`),
`TFRecordSource` and `ParquetSource` (`formatsources`) over the two."""

from .api import ArrayRecordSource, recorded_spec
from .fetch import Fetcher, RawChunkCache
from .formatsources import ParquetSource, TFRecordSource
from .records import ChunkCache
from .table import RecordTable

__all__ = ["ArrayRecordSource", "ChunkCache", "Fetcher", "ParquetSource", "RawChunkCache",
           "RecordTable", "TFRecordSource", "recorded_spec"]
