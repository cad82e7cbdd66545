"""Apache Beam I/O for ArrayRecord (the `beam` extra): a sink, a source, and conversions.

The only package that imports apache_beam; nothing else in aioloader imports it back, so the
rest of the package works without Beam installed.

    records | WriteToArrayRecord("gs://b/train", num_shards=64)     # sink.py
    p | ReadFromArrayRecord("gs://b/train-*.array_record")           # source.py
    p | ConvertToArrayRecord(["gs://b/raw/*.tfrecord"], "gs://b/train")  # pipelines.py
"""

from ..errors import MissingExtraError

try:
    import apache_beam  # noqa: F401
except ImportError as exc:
    raise MissingExtraError("beam", "aioloader.beam (and convert --runner beam)",
                            exc.name) from None

from .sink import WriteToArrayRecord, finalize_shards
from .source import ReadFromArrayRecord, match_files

__all__ = ["ReadFromArrayRecord", "WriteToArrayRecord", "finalize_shards", "match_files"]
