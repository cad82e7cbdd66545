"""How many bytes a fetched column chunk may decode to, from its page headers, before
pyarrow decodes it: the bound `decode_row_group` holds to the memory budget.

Pages of plain values decode to about their decompressed size. Pages of dictionary indices
do not: each small index expands to its dictionary entry, so a 10 kB dictionary and a few
bytes of run-length indices can decode to gigabytes. Such values count as wide as their type
or, for strings and binaries, as the longest dictionary entry: a first bound takes the
dictionary page's whole size for that, and only when it does not fit the budget is the
dictionary page decompressed and its entries' lengths read for the true longest (a loop
over the entries, so it is done only when needed). Every value also counts `VALUE_COST`
bytes of levels, offsets and validity. DELTA_BYTE_ARRAY values (each a prefix of an earlier
value and a suffix) count as long as the suffixes before them (`PageTotals.delta_bound`).
"""

from __future__ import annotations

import struct

from .layout import VALUE_COST, ColumnChunk
from .pages import LENGTH, PageError, PageTotals

__all__ = ["decoded_bound"]

_LENGTH = struct.Struct("<I")  # a PLAIN byte array's length prefix (`LENGTH` bytes)
assert _LENGTH.size == LENGTH

#: the footer's codec names pyarrow's `decompress` takes (Parquet's LZ4 and LZO are
#: framed in ways it does not: their dictionaries keep the first bound)
CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
          "LZ4_RAW": "lz4_raw"}


def decoded_bound(chunk: ColumnChunk, totals: PageTotals, data: bytes | memoryview, *,
                  exact_dictionary: bool) -> int:
    """At most how many bytes `chunk` (its fetched bytes: `data`) decodes to, given its page
    walk; `exact_dictionary` reads the dictionary's longest entry instead of taking its
    page's size. Raises `PageError` on a dictionary page that does not decode."""
    bound = totals.decompressed + VALUE_COST * totals.values + totals.delta_bound
    if not totals.dictionary_values:
        return bound
    if chunk.width:
        return bound + totals.dictionary_values * chunk.width
    if totals.dictionary is None:  # indices with no dictionary: pyarrow refuses the chunk
        return bound
    start, compressed, size = totals.dictionary
    longest = max(size - LENGTH, 0)
    if exact_dictionary and (chunk.codec == "UNCOMPRESSED" or chunk.codec in CODECS):
        longest = _longest_entry(memoryview(data)[start:start + compressed], chunk.codec,
                                 size, start)
    return bound + totals.dictionary_values * longest


def _longest_entry(body: memoryview, codec: str, size: int, offset: int) -> int:
    if codec == "UNCOMPRESSED":
        raw = body
    else:
        import pyarrow as pa

        try:
            raw = memoryview(pa.decompress(body, decompressed_size=size, codec=CODECS[codec],
                                           asbytes=False))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise PageError(f"the dictionary page does not decompress: {e}", offset) from None
    if len(raw) != size:
        raise PageError(f"the dictionary page decompresses to {len(raw)} bytes, its header "
                        f"declares {size}", offset)
    pos = longest = 0
    last = size - LENGTH
    length = _LENGTH.unpack_from  # (a slice and int.from_bytes per entry cost 3x)
    while pos <= last:
        n = length(raw, pos)[0]
        if n > longest:
            longest = n
        pos += LENGTH + n
    if pos != size:
        raise PageError("the dictionary page's entries run past its end", offset)
    return longest
