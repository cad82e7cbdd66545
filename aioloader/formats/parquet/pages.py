"""The page headers of a fetched column chunk, walked before pyarrow decodes it.

The footer's figures bound what a row group may take, but pyarrow allocates from each
page's own header: its decompressed size and its value count. A page header that lies (a
2 GiB page in a 4 KiB chunk, more values than the chunk declares, a page running past the
chunk's bytes) would make pyarrow allocate before it can notice. So each page header is read
here first, with a small reader of thrift's compact protocol that knows only the few fields
it needs and skips the rest, and the totals are checked against the chunk and the budget.
The walk stops where Arrow's reader does: once the data pages have given the chunk's values.
"""

from __future__ import annotations

from dataclasses import dataclass

from .thrift import I32, STRUCT, ThriftError, ThriftReader

__all__ = ["PageError", "PageTotals", "walk_pages"]

#: a page header that does not parse or does not fit its chunk (offset: in the chunk)
PageError = ThriftError

DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY: values are dictionary indices
#: each value the start of an earlier one (of any earlier page: some writers carry it over)
#: and a suffix: a value is at most as long as the suffixes so far, which the pages' bytes
#: hold, but its length is not bounded by its own page's. DELTA_LENGTH_BYTE_ARRAY and the
#: other encodings store each value's bytes (or decode to at most `VALUE_COST` a value).
DELTA_BYTE_ARRAY = 7
#: a PLAIN byte array's length prefix: the fewest bytes a dictionary entry of one takes
LENGTH = 4


@dataclass(frozen=True)
class PageTotals:
    pages: int
    values: int  #: the data pages' values
    decompressed: int  #: every page's declared decompressed size
    dictionary_values: int = 0  #: values of data pages holding dictionary indices
    #: (offset of its bytes in the chunk, compressed, decompressed size) of the dictionary page
    dictionary: tuple[int, int, int] | None = None
    #: at most how many bytes the DELTA_BYTE_ARRAY pages' values take: each page's values
    #: times those pages' decompressed bytes so far
    delta_bound: int = 0
    #: the DELTA_BYTE_ARRAY pages' decompressed bytes: the longest such value may take
    delta_longest: int = 0


def _counts(t: ThriftReader, encoding_field: int) -> tuple[int, int]:
    """Field 1 (`num_values`) and the encoding of a data or dictionary page's header
    (-1 when absent); the rest skipped."""
    values, encoding = None, -1
    for fid, kind in t.fields():
        if fid == 1 and kind == I32:
            values = t.integer()
        elif fid == encoding_field and kind == I32:
            encoding = t.integer()
        else:
            t.skip(kind, 1)
    if values is None:
        raise PageError("a page header has no value count", t.pos)
    return values, encoding


def _header(t: ThriftReader) -> tuple[int, int, int, int, int]:
    """(page type, decompressed size, compressed size, values, encoding) of the header at
    `t.pos`."""
    kind = decompressed = compressed = None
    values, encoding = 0, -1
    for fid, ftype in t.fields():
        if fid in (1, 2, 3) and ftype == I32:
            v = t.integer()
            if fid == 1:
                kind = v
            elif fid == 2:
                decompressed = v
            else:
                compressed = v
        elif fid in (5, 7, 8) and ftype == STRUCT:
            # the encoding is field 2 of a v1 data page's header, 4 of a v2's
            values, encoding = _counts(t, {5: 2, 7: 2, 8: 4}[fid])
        else:
            t.skip(ftype)
    if kind is None or decompressed is None or compressed is None:
        raise PageError("a page header lacks its type or sizes", t.pos)
    return kind, decompressed, compressed, values, encoding


def walk_pages(data: bytes | memoryview, num_values: int, *, max_decompressed: int,
               width: int | None = None) -> PageTotals:
    """The page headers of one column chunk (`data`: its bytes from its first page on),
    up to the data page that completes its `num_values`. Raises `PageError` when a header
    does not parse, a page runs past `data`, the values disagree with `num_values`, the
    dictionary page declares more entries than its bytes hold (`width`: bytes a value
    takes, 0 for byte arrays, 1 for booleans as well; None: not checked), or the pages'
    decompressed sizes pass `max_decompressed`."""
    view = memoryview(data)
    pos = pages = seen = decompressed = indices = delta_bytes = delta_bound = 0
    dictionary = None
    while seen < num_values:
        if pos >= len(view):
            raise PageError(f"the pages end after {seen} of the chunk's {num_values} values",
                            pos)
        t = ThriftReader(view, pos, len(view))
        kind, size, compressed, values, encoding = _header(t)
        if size < 0 or compressed < 0 or values < 0:
            raise PageError(f"a page header declares a negative size or count ({compressed} "
                            f"bytes, {size} decompressed, {values} values)", pos)
        if compressed > len(view) - t.pos:
            raise PageError(f"a page of {compressed} bytes runs past the chunk's "
                            f"{len(view)} bytes", pos)
        decompressed += size
        if decompressed > max_decompressed:
            raise PageError(f"its pages decompress to more than the {max_decompressed} "
                            "bytes the memory budget allows", pos,
                            budget=True)
        if kind in (DATA_PAGE, DATA_PAGE_V2):
            seen += values
            if encoding in DICTIONARY_ENCODINGS:
                indices += values
            elif encoding == DELTA_BYTE_ARRAY:
                delta_bytes += size
                delta_bound += values * delta_bytes
        elif kind == DICTIONARY_PAGE and dictionary is None:
            # pyarrow sizes the dictionary from its count before it reads an entry
            least = 0 if width is None else values * LENGTH if not width \
                else -(-values // 8) if width == 1 else values * width
            if least > size:
                raise PageError(f"the dictionary page declares {values} entries, more than "
                                f"its {size} bytes hold", pos)
            dictionary = (t.pos, compressed, size)
        pages += 1
        pos = t.pos + compressed
    if seen != num_values:
        raise PageError(f"its data pages hold {seen} values, the chunk declares {num_values}",
                        pos)
    return PageTotals(pages, seen, decompressed, indices, dictionary, delta_bound,
                      delta_bytes)
