"""The ArrayRecord file format: bytes in, bytes out. No I/O policy, no asyncio.

Layers, bottom up: `hashing` (HighwayHash-64), `varint`, `layout` (blocks and chunk
headers), `codecs`, `chunk` (simple chunks), `proto` and `options` (footer messages),
`fileindex` (where chunks lie), `decoding` (chunks from bytes), `index` (open a file from
byte ranges), `reader` and `writer`.
"""

from .chunk import DEFAULT_MAX_DECODED, DEFAULT_VERIFY, VERIFY_LEVELS, ChunkRecords
from .errors import ArrayRecordFormatError
from .index import DEFAULT_TAIL, FileIndex, decode_chunk, open_index, read_index
from .options import WriterOptions, parse_options
from .reader import RangeReader
from .writer import ArrayRecordWriter

__all__ = [
    "DEFAULT_MAX_DECODED",
    "DEFAULT_TAIL",
    "DEFAULT_VERIFY",
    "VERIFY_LEVELS",
    "ArrayRecordFormatError",
    "ArrayRecordWriter",
    "ChunkRecords",
    "FileIndex",
    "RangeReader",
    "WriterOptions",
    "decode_chunk",
    "open_index",
    "parse_options",
    "read_index",
]
