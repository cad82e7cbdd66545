"""The tiers between the bucket and the workers: the memory tier (`segments`: segments of a
remote dataset in one memory file, bounded in bytes, fetched ahead where upcoming records
lie densely, `readahead`; `places`: where they lie; `firstread`: the first read goes
alone), and the disk tier under it (`disk`: entries, `tier`: segments)."""

from .readahead import dense_segments
from .segments import SEGMENT_BYTES, FetchSegment, SegmentStore

__all__ = ["SEGMENT_BYTES", "FetchSegment", "SegmentStore", "dense_segments"]
