"""The transposed chunk's state machine, parsed from its decompressed header.

Apart from the walk (`transposed`) because it is read once per chunk and checked whole before
the walk starts: the node count against the memory budget, every tag, varint subtype and
buffer index, every next-node index, and the absence of a loop of implicit transitions (which
would walk forever without reading a transition byte). The nodes come out as parallel lists,
which the walk indexes faster than objects.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .varint import encode_varint, read_varint

# Reserved node ids (tags below 8 are not proto tags).
_NOOP, _NONPROTO, _START_OF_SUBMESSAGE, _START_OF_MESSAGE = 0, 1, 2, 3
_SUBMESSAGE_WIRE_TYPE = 6  # a tag with this wire type ends a submessage
_INLINE0 = 10  # varint subtypes 0..9: 1..10 bytes in a buffer; 10..137: value - 10, inline
_INLINE_MAX = _INLINE0 + 0x7F

# What a node does when visited.
K_NOOP, K_MESSAGE, K_NONPROTO, K_SUB_START, K_SUB_END, K_COPY, K_VARINT, K_FIXED, K_STRING = \
    range(9)

NODE_COST = 256
"""Bytes of memory charged to the budget per state-machine node (its Python objects)."""


def fail(what: str) -> ArrayRecordFormatError:
    """The error for a malformed transposed chunk, saying `what`."""
    return ArrayRecordFormatError(f"transposed chunk: {what}", hint=CORRUPT_HINT)


class Header:
    """A cursor over the decompressed header, reading varints with named failures."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def varint(self, what: str, bits: int = 64) -> int:
        try:
            value, end = read_varint(self.buf, self.pos)
        except ArrayRecordFormatError:
            raise fail(f"header ends or breaks inside the {what}") from None
        if bits == 32 and (value >> 32 or end - self.pos > 5):
            raise fail(f"{what} {value} does not fit 32 bits")
        self.pos = end
        return value

    def count(self, what: str, min_bytes: int = 1) -> int:
        """A count of items that each take at least `min_bytes` of the rest of the header."""
        n = self.varint(what, 32)
        if n * min_bytes > len(self.buf) - self.pos:
            raise fail(f"{what} {n} is more than the {len(self.buf) - self.pos} header "
                       "bytes left can describe")
        return n


def parse_nodes(h: Header, num_buffers: int, budget: list) -> tuple:
    """The state machine as parallel lists: kind, tag bytes, buffer, length, next, implicit."""
    count = h.count("node count", 2)  # a tag and a next index each
    budget[0] -= NODE_COST * count
    if budget[0] < 0:
        raise fail(f"{count} state machine nodes exceed the memory budget")
    tags = [h.varint("node tag", 32) for _ in range(count)]
    nexts = [h.varint("next node", 32) for _ in range(count)]
    n_sub = sum(1 for t in tags if t >= 8 and t & 7 == 0)
    if n_sub > len(h.buf) - h.pos:
        raise fail("header ends inside the subtypes")
    subtypes = iter(h.buf[h.pos : h.pos + n_sub])
    h.pos += n_sub
    nodes = [_node(i, tag, subtypes, h, num_buffers) for i, tag in enumerate(tags)]
    kinds, tag_bytes, bufs, args = (list(column) for column in zip(*nodes)) if nodes else \
        ([], [], [], [])
    if K_NONPROTO in kinds and not num_buffers:
        raise fail("a non-proto node but no buffer for non-proto record lengths")
    implicit = [nx >= count for nx in nexts]
    nexts = [nx - count if nx >= count else nx for nx in nexts]
    for i, nx in enumerate(nexts):
        if nx >= count:
            raise fail(f"node {i} leads to node {nx}, beyond the {count} nodes")
    _check_no_implicit_loop(nexts, implicit)
    return kinds, tag_bytes, bufs, args, nexts, implicit


def _node(i: int, tag: int, subtypes: Iterator[int], h: Header,
          num_buffers: int) -> tuple[int, bytes, int, int]:
    """Node `i`: what it does, the tag bytes it writes, its buffer (or -1) and its argument
    (a field's length); its varint subtype and buffer index are read in node order."""
    if tag == _NOOP:
        return K_NOOP, b"", -1, 0
    if tag == _NONPROTO:
        return K_NONPROTO, b"", _buffer_index(h, num_buffers), 0
    if tag == _START_OF_MESSAGE:
        return K_MESSAGE, b"", -1, 0
    if tag == _START_OF_SUBMESSAGE:
        return K_SUB_START, b"", -1, 0
    wire = tag & 7
    end_of_sub = wire == _SUBMESSAGE_WIRE_TYPE
    if end_of_sub:
        tag, wire = tag - _SUBMESSAGE_WIRE_TYPE + 2, 2
    if tag < 8 or wire > 5:
        raise fail(f"node {i} has invalid tag {tag}")
    data, arg = encode_varint(tag), 0
    if wire == 0:
        sub = next(subtypes)
        if sub > _INLINE_MAX:
            raise fail(f"node {i} has invalid varint subtype {sub}")
        if sub >= _INLINE0:
            return K_COPY, data + bytes((sub - _INLINE0,)), -1, 0
        kind, arg = K_VARINT, sub + 1
    elif wire in (1, 5):
        kind, arg = K_FIXED, 8 if wire == 1 else 4
    elif wire == 2:
        kind = K_SUB_END if end_of_sub else K_STRING
    else:  # start or end of a group: the tag alone
        return K_COPY, data, -1, 0
    return kind, data, (_buffer_index(h, num_buffers) if kind != K_SUB_END else -1), arg


def _buffer_index(h: Header, num_buffers: int) -> int:
    b = h.varint("buffer index", 32)
    if b >= num_buffers:
        raise fail(f"buffer index {b} beyond the {num_buffers} buffers")
    return b


def _check_no_implicit_loop(nexts: list, implicit: list) -> None:
    """Implicit steps read no transition byte: a cycle of them would never end."""
    seen = [0] * len(nexts)
    for i in range(len(nexts)):
        if seen[i]:
            continue
        mark = i + 1
        seen[i] = mark
        j = i
        while implicit[j]:
            j = nexts[j]
            if seen[j] == mark:
                raise fail(f"nodes {i}..{j} form a loop of implicit transitions")
            if seen[j]:
                break
            seen[j] = mark
