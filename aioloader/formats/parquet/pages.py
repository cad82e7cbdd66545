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

__all__ = ["PageError", "PageTotals", "walk_pages"]

DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
_MAX_DEPTH = 32  # thrift nesting a page header may use; deeper is hostile
# compact protocol field types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = \
    range(1, 13)


class PageError(ValueError):
    """A page header that does not parse or does not fit its chunk: `offset` is where it
    starts, relative to the chunk (the caller names the file, row group and column)."""

    def __init__(self, what: str, offset: int, *, budget: bool = False) -> None:
        super().__init__(what)
        self.offset = offset
        self.budget = budget  # the pages are sound but larger than the budget allows


DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY: values are dictionary indices


@dataclass(frozen=True)
class PageTotals:
    pages: int
    values: int  #: the data pages' values
    decompressed: int  #: every page's declared decompressed size
    dictionary_values: int = 0  #: values of data pages holding dictionary indices
    #: (offset of its bytes in the chunk, compressed, decompressed size) of the dictionary page
    dictionary: tuple[int, int, int] | None = None


class _Thrift:
    """Just enough of thrift's compact protocol to read a `PageHeader`."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise PageError("a page header runs past the chunk's bytes", self.pos)
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise PageError("a page header holds a varint longer than 10 bytes", self.pos)

    def integer(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def fields(self):
        """(field id, type) of each field of a struct, up to its stop byte."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.integer()
            yield last, kind

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise PageError("a page header nests deeper than thrift structs do", self.pos)
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.advance(8)
        elif kind == _BINARY:
            self.advance(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            count = head >> 4 if head >> 4 != 15 else self.varint()
            self.items(count, [head & 0x0F], depth)
        elif kind == _MAP:
            count = self.varint()
            if count:
                types = self.byte()
                self.items(count, [types >> 4, types & 0x0F], depth)
        elif kind == _STRUCT:
            for _, k in self.fields():
                self.skip(k, depth + 1)
        else:
            raise PageError(f"a page header holds an unknown thrift type {kind}", self.pos)

    def items(self, count: int, kinds: list[int], depth: int) -> None:
        if count > self.end - self.pos:  # each item takes at least a byte
            raise PageError(f"a page header declares {count} items in "
                            f"{self.end - self.pos} bytes", self.pos)
        for _ in range(count):
            for k in kinds:
                if k in (_TRUE, _FALSE):  # a bool item takes a byte, unlike a bool field
                    self.byte()
                else:
                    self.skip(k, depth + 1)

    def advance(self, n: int) -> None:
        if n > self.end - self.pos:
            raise PageError("a page header runs past the chunk's bytes", self.pos)
        self.pos += n

    def counts(self, encoding_field: int) -> tuple[int, int]:
        """Field 1 (`num_values`) and the encoding of a data or dictionary page's header
        (-1 when absent); the rest skipped."""
        values, encoding = None, -1
        for fid, kind in self.fields():
            if fid == 1 and kind == _I32:
                values = self.integer()
            elif fid == encoding_field and kind == _I32:
                encoding = self.integer()
            else:
                self.skip(kind, 1)
        if values is None:
            raise PageError("a page header has no value count", self.pos)
        return values, encoding


def _header(t: _Thrift) -> tuple[int, int, int, int, int]:
    """(page type, decompressed size, compressed size, values, encoding) of the header at
    `t.pos`."""
    kind = decompressed = compressed = None
    values, encoding = 0, -1
    for fid, ftype in t.fields():
        if fid in (1, 2, 3) and ftype == _I32:
            v = t.integer()
            if fid == 1:
                kind = v
            elif fid == 2:
                decompressed = v
            else:
                compressed = v
        elif fid in (5, 7, 8) and ftype == _STRUCT:
            # the encoding is field 2 of a v1 data page's header, 4 of a v2's
            values, encoding = t.counts({5: 2, 7: 2, 8: 4}[fid])
        else:
            t.skip(ftype)
    if kind is None or decompressed is None or compressed is None:
        raise PageError("a page header lacks its type or sizes", t.pos)
    return kind, decompressed, compressed, values, encoding


def walk_pages(data: bytes | memoryview, num_values: int, *,
               max_decompressed: int) -> PageTotals:
    """The page headers of one column chunk (`data`: its bytes from its first page on),
    up to the data page that completes its `num_values`. Raises `PageError` when a header
    does not parse, a page runs past `data`, the values disagree with `num_values`, or the
    pages' decompressed sizes pass `max_decompressed`."""
    view = memoryview(data)
    pos = pages = seen = decompressed = indices = 0
    dictionary = None
    while seen < num_values:
        if pos >= len(view):
            raise PageError(f"the pages end after {seen} of the chunk's {num_values} values",
                            pos)
        t = _Thrift(view, pos, len(view))
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
        elif kind == DICTIONARY_PAGE and dictionary is None:
            dictionary = (t.pos, compressed, size)
        pages += 1
        pos = t.pos + compressed
    if seen != num_values:
        raise PageError(f"its data pages hold {seen} values, the chunk declares {num_values}",
                        pos)
    return PageTotals(pages, seen, decompressed, indices, dictionary)
