"""Just enough of thrift's compact protocol to read Parquet's own structs: a reader that
knows field ids and types, reads the integers and strings asked for and skips the rest.

Parquet's page headers and footer are thrift. pyarrow parses them too, but it allocates
from a page header's figures before anything can check them, and some of its footer
accessors abort the process on a malformed footer rather than raise. Reading the few fields
the loader needs here keeps both checkable: every length and count is held to the bytes
that are there, and nesting to a fixed depth, so that any input ends in a `ThriftError`.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["ThriftError", "ThriftReader"]

MAX_DEPTH = 32  # thrift nesting Parquet's structs use is a few levels; deeper is hostile
# compact protocol field types
TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)


class ThriftError(ValueError):
    """Thrift that does not parse or does not fit: `offset` is where, relative to the
    bytes read (the caller names the file, row group and column)."""

    def __init__(self, what: str, offset: int, *, budget: bool = False) -> None:
        super().__init__(what)
        self.offset = offset
        self.budget = budget  # the input is sound but larger than the budget allows


class ThriftReader:
    """Reads `buf[pos:end]`; `fields()` walks a struct, the typed readers take a value."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise ThriftError("thrift runs past the bytes that hold it", self.pos)
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        shift = value = 0
        while pos < end:
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return value
            shift += 7
            if shift > 63:
                raise ThriftError("a thrift varint is longer than 10 bytes", pos)
        raise ThriftError("thrift runs past the bytes that hold it", pos)

    def integer(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def binary(self) -> bytes:
        n = self.varint()
        self.advance(n)
        return bytes(self.buf[self.pos - n:self.pos])

    def list_header(self) -> tuple[int, int]:
        """(element type, count) of a list; the count held to the bytes left."""
        head = self.byte()
        count = head >> 4 if head >> 4 != 15 else self.varint()
        if count > self.end - self.pos:  # each item takes at least a byte
            raise ThriftError(f"a thrift list declares {count} items in "
                              f"{self.end - self.pos} bytes", self.pos)
        return head & 0x0F, count

    def fields(self) -> Iterator[tuple[int, int]]:
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
        if depth > MAX_DEPTH:
            raise ThriftError("thrift nests deeper than Parquet's structs do", self.pos)
        if kind in (I16, I32, I64):
            self.varint()
        elif kind == STRUCT:
            self.skip_struct(depth + 1)
        elif kind == BINARY:
            self.advance(self.varint())
        elif kind in (TRUE, FALSE):
            return
        elif kind == BYTE:
            self.advance(1)
        elif kind == DOUBLE:
            self.advance(8)
        elif kind in (LIST, SET):
            elem, count = self.list_header()
            self.items(count, [elem], depth)
        elif kind == MAP:
            count = self.varint()
            if count:
                types = self.byte()
                self.items(count, [types >> 4, types & 0x0F], depth)
        else:
            raise ThriftError(f"an unknown thrift type {kind}", self.pos)

    def skip_struct(self, depth: int) -> None:
        """A struct's fields up to its stop byte, skipped (the hot loop of a footer)."""
        buf, end = self.buf, self.end
        while True:
            if self.pos >= end:
                raise ThriftError("thrift runs past the bytes that hold it", self.pos)
            head = buf[self.pos]
            self.pos += 1
            if head == 0:
                return
            if not head >> 4:  # a long-form field id follows
                self.varint()
            kind = head & 0x0F
            if kind in (I16, I32, I64):  # most fields: a varint, skipped inline
                self.skip_varints(1)
            else:
                self.skip(kind, depth)

    def skip_varints(self, count: int) -> None:
        buf, pos, end = self.buf, self.pos, self.end
        for _ in range(count):
            start = pos
            while True:
                if pos >= end:
                    raise ThriftError("thrift runs past the bytes that hold it", pos)
                b = buf[pos]
                pos += 1
                if b < 0x80:
                    break
                if pos - start >= 10:
                    raise ThriftError("a thrift varint is longer than 10 bytes", pos)
        self.pos = pos

    def items(self, count: int, kinds: list[int], depth: int) -> None:
        if count > self.end - self.pos:  # each item takes at least a byte
            raise ThriftError(f"thrift declares {count} items in {self.end - self.pos} "
                              "bytes", self.pos)
        if len(kinds) == 1 and kinds[0] in (I16, I32, I64):
            self.skip_varints(count)
            return
        for _ in range(count):
            for k in kinds:
                if k in (TRUE, FALSE):  # a bool item takes a byte, unlike a bool field
                    self.byte()
                else:
                    self.skip(k, depth + 1)

    def advance(self, n: int) -> None:
        if n > self.end - self.pos:
            raise ThriftError("thrift runs past the bytes that hold it", self.pos)
        self.pos += n
