"""The usual small file's postscript and footer, each parsed and checked by one native call.

Opening thousands of small files is mostly these two parses, and in Python each takes a chunk
decode, a few hashes, two decompressions and two protobuf messages: some two hundred calls a
file. The C extension (`_footer.postscript`, `_footer.small_footer`) does the same work and
the same checks in one call each, calling back only for the hashes (`hashing.highwayhash64`,
the `_highwayhash` extension where built) and for a compressed block (`codecs._decompress`:
the codec libraries stay Python's, so the extension links none). It gives way (None) on
anything that is not the usual file or not intact, and the general path (`postscript`,
`index`) then parses it or says what is wrong, so a damaged file raises the same error either
way. Without the extension (or with one built before these functions) both answer None.

Footer ranges larger than `MAX_RANGE` take the general path: theirs is mostly the entries'
parse, which is native there too, and that path is tuned for their memory.
"""

from __future__ import annotations

import numpy as np

from .codecs import _decompress
from .fileindex import FileIndex, ones_like
from .hashing import highwayhash64

try:
    from . import _footer as _native
except ImportError:  # no compiler at install: the general path does it all
    _native = None  # type: ignore[assignment]

_postscript = getattr(_native, "postscript", None)
_small_footer = getattr(_native, "small_footer", None)

MAX_RANGE = 1 << 20
"""The largest footer range (bytes from the footer chunk to the postscript) parsed here."""

__all__ = ["MAX_RANGE", "available", "footer_index", "postscript_offset"]


def available() -> bool:
    """Whether the native parses are in use (the extension is built, with both functions)."""
    return _postscript is not None and _small_footer is not None


def postscript_offset(raw, pos: int, verify: str, block_end: int) -> int | None:
    """The footer offset the usual postscript at `pos` holds, from `raw` (the last block's
    bytes from `pos`, at least the postscript and its padding chunk's header; the block ends
    at `block_end`); None when not native or not the usual intact postscript."""
    if _postscript is None:
        return None
    return _postscript(raw, pos, block_end, verify != "none", highwayhash64)


def footer_index(raw, footer_offset: int, size: int, verify: str, path: str | None,
                 max_decoded: int, have: int) -> FileIndex | None:
    """The `FileIndex` of a file of `size` bytes whose footer chunk's physical bytes `raw`
    start at `footer_offset`, its range ending at `have`; the same index the general path
    (`index._parse_footer`) builds, or None where that path must decide."""
    if _small_footer is None or have - footer_offset > MAX_RANGE:
        return None
    got = _small_footer(raw, footer_offset, have, max_decoded, verify != "none",
                        highwayhash64, _decompress)
    if got is None:
        return None
    raw_bounds, raw_decoded, narrow, raw_records, options, spec, total, most, widest = got
    bounds = np.frombuffer(raw_bounds, dtype=np.int64)
    offsets = bounds[:-1]  # a prefix view: the record table shares `bounds` (FileIndex.bounds)
    if narrow:
        decoded = np.frombuffer(raw_decoded, dtype=np.uint32)
    else:
        decoded = np.frombuffer(raw_decoded, dtype=np.int64)
        if widest < 1 << 32:
            decoded = decoded.astype(np.uint32)
    records = (ones_like(offsets) if most == 1 else
               np.frombuffer(raw_records, dtype=np.int64))
    index = FileIndex(path, size, footer_offset, offsets, records, decoded,
                      options.decode("utf-8", "replace"), spec.decode("utf-8", "replace"))
    vars(index).update(num_records=total, max_records=most)  # known: not recounted
    return index
