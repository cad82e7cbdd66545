"""The ArrayRecord file format: bytes in, bytes out. No I/O policy, no asyncio.

Layers, bottom up: `hashing` (HighwayHash-64), `varint`, `layout` (blocks and chunk
headers), `codecs`, `chunk` (simple chunks), `proto` and `options` (footer messages),
`fileindex` (where chunks lie), `decoding` (chunks from bytes), `index` (open a file from
byte ranges), `reader` and `writer`.

The names below load their module on first use, so that a module naming one of them (the
verify levels, the format error) does not load the codecs, the index and the writer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .chunk import ChunkRecords
    from .errors import ArrayRecordFormatError
    from .index import DEFAULT_TAIL, FileIndex, decode_chunk, open_index, read_index
    from .levels import DEFAULT_MAX_DECODED, DEFAULT_VERIFY, VERIFY_LEVELS
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

_HOMES = {
    **dict.fromkeys(["DEFAULT_MAX_DECODED", "DEFAULT_VERIFY", "VERIFY_LEVELS"], ".levels"),
    **dict.fromkeys(["DEFAULT_TAIL", "FileIndex", "decode_chunk", "open_index", "read_index"],
                    ".index"),
    **dict.fromkeys(["WriterOptions", "parse_options"], ".options"),
    "ArrayRecordFormatError": ".errors",
    "ArrayRecordWriter": ".writer",
    "ChunkRecords": ".chunk",
    "RangeReader": ".reader",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
