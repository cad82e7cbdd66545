"""Riegeli's physical layout: 64 KiB blocks, 24-byte block headers, 40-byte chunk headers.

A block header sits at every multiple of 64 KiB and interrupts chunks at any byte, even in
the middle of a chunk header. Readers therefore work on the *logical* stream (all bytes whose
block offset is >= 24); writers lay logical bytes out physically with `chunk_end` and
`physical_chunk`. See ARRAYRECORD_FORMAT.md §4-§6.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .hashing import highwayhash64

BLOCK_SIZE = 1 << 16
BLOCK_HEADER_SIZE = 24
USABLE_BLOCK_SIZE = BLOCK_SIZE - BLOCK_HEADER_SIZE
CHUNK_HEADER_SIZE = 40

CHUNK_SIGNATURE = 0x73  # 's'
CHUNK_METADATA = 0x6D  # 'm'
CHUNK_PADDING = 0x70  # 'p'
CHUNK_SIMPLE = 0x72  # 'r'
CHUNK_TRANSPOSED = 0x74  # 't'

_HEADER = struct.Struct("<QQQQQ")
_BLOCK = struct.Struct("<QQQ")
_tuple_new = tuple.__new__


def remaining_in_block(pos: int) -> int:
    """Bytes from `pos` to the next block boundary (0 on a boundary)."""
    return -pos % BLOCK_SIZE


def add_with_overhead(begin: int, length: int) -> int:
    """Physical position after `length` logical bytes of a chunk starting at `begin`."""
    return (
        begin
        + length
        + BLOCK_HEADER_SIZE * ((length + (begin + USABLE_BLOCK_SIZE - 1) % BLOCK_SIZE)
                               // USABLE_BLOCK_SIZE)
    )


def round_up_to_boundary(pos: int) -> int:
    """Move a position that would sit inside or right after a block header past it."""
    return pos + max(0, remaining_in_block(pos) - (USABLE_BLOCK_SIZE - 1))


def chunk_end(begin: int, data_size: int, num_records: int) -> int:
    """Where the chunk starting at `begin` ends, and so where the next one begins."""
    return max(
        add_with_overhead(begin, CHUNK_HEADER_SIZE + data_size),
        round_up_to_boundary(begin + num_records),
    )


def strip_block_headers(buf, start: int, *, verify: bool = True, path: str | None = None):
    """The logical bytes of the physical range `[start, start + len(buf))`.

    Returns a zero-copy memoryview when no block header falls in the range. With `verify`,
    every block header wholly inside the range has its hash checked.
    """
    view = memoryview(buf)
    end = start + len(view)
    first = start - start % BLOCK_SIZE
    if start % BLOCK_SIZE >= BLOCK_HEADER_SIZE and end <= first + BLOCK_SIZE:
        return view
    pieces = []
    boundary = first
    while boundary < end:
        lo = max(start, boundary + BLOCK_HEADER_SIZE)
        hi = min(end, boundary + BLOCK_SIZE)
        if verify and boundary >= start and boundary + BLOCK_HEADER_SIZE <= end:
            check_block_header(view[boundary - start : boundary - start + BLOCK_HEADER_SIZE],
                               boundary, path)
        if lo < hi:
            pieces.append(view[lo - start : hi - start])
        boundary += BLOCK_SIZE
    if len(pieces) == 1:
        return pieces[0]
    return memoryview(b"".join(pieces))


def check_block_header(raw, pos: int, path: str | None = None) -> tuple[int, int]:
    """Verify one block header's hash; return (previous_chunk, next_chunk)."""
    stored, prev, nxt = _BLOCK.unpack(raw)
    if highwayhash64(raw[8:24]) != stored:
        raise ArrayRecordFormatError(
            "block header hash mismatch", path=path, offset=pos, hint=CORRUPT_HINT
        )
    return prev, nxt


def block_header(pos: int, chunk_begin: int, chunk_stop: int) -> bytes:
    """The 24-byte block header at boundary `pos` inside chunk [chunk_begin, chunk_stop)."""
    body = struct.pack("<QQ", pos - chunk_begin, chunk_stop - pos)
    return struct.pack("<Q", highwayhash64(body)) + body


class ChunkHeader(NamedTuple):
    """The fixed 40-byte header in front of every chunk."""

    data_size: int
    data_hash: int
    chunk_type: int
    num_records: int
    decoded_data_size: int

    @classmethod
    def parse(
        cls, raw, *, verify: bool = True, path: str | None = None, offset: int | None = None
    ) -> ChunkHeader:
        return _parse_chunk_header(cls, raw, verify, path, offset)

    def pack(self) -> bytes:
        body = struct.pack(
            "<QQQQ",
            self.data_size,
            self.data_hash,
            self.chunk_type | (self.num_records << 8),
            self.decoded_data_size,
        )
        return struct.pack("<Q", highwayhash64(body)) + body


def _parse_chunk_header(cls, raw, verify, path, offset) -> ChunkHeader:
    """`ChunkHeader.parse` with positional arguments (the per-chunk hot path)."""
    if len(raw) < CHUNK_HEADER_SIZE:
        raise ArrayRecordFormatError(
            f"chunk header truncated ({len(raw)} of {CHUNK_HEADER_SIZE} bytes)",
            path=path, offset=offset, hint=CORRUPT_HINT,
        )
    header_hash, data_size, data_hash, type_count, decoded = _HEADER.unpack_from(raw)
    if verify and highwayhash64(raw[8:CHUNK_HEADER_SIZE]) != header_hash:
        raise ArrayRecordFormatError(
            "chunk header hash mismatch", path=path, offset=offset, hint=CORRUPT_HINT
        )
    return _tuple_new(cls, (data_size, data_hash, type_count & 0xFF, type_count >> 8, decoded))


def encode_chunk(chunk_type: int, data: bytes, num_records: int, decoded_size: int) -> bytes:
    """Header plus data of a chunk, logically (block headers are added by `physical_chunk`)."""
    header = ChunkHeader(len(data), highwayhash64(data), chunk_type, num_records, decoded_size)
    return header.pack() + data


def physical_chunk(begin: int, logical: bytes, num_records: int) -> bytes:
    """Lay out one logical chunk (header + data) starting at physical `begin`.

    Inserts a block header at every boundary the chunk crosses and zero-fills up to
    `chunk_end` (a chunk is at least `num_records` bytes long).
    """
    return b"".join(physical_pieces(begin, (logical,), num_records))


def physical_pieces(begin: int, logical_parts, num_records: int) -> list:
    """`physical_chunk` of the logical chunk `b"".join(logical_parts)`, as a list of pieces
    (block headers, zero-copy views of the parts, zero fill) to write one after another."""
    parts: list[memoryview | bytes] = [
        v for v in (memoryview(p).cast("B") for p in logical_parts) if len(v)]
    length = sum(map(len, parts))
    stop = chunk_end(begin, length - CHUNK_HEADER_SIZE, num_records)
    in_block = begin % BLOCK_SIZE
    if in_block and stop - begin <= BLOCK_SIZE - in_block:  # no block boundary to cross
        if stop - begin > length:
            parts.append(bytes(stop - begin - length))
        return parts
    out: list = []
    pos = begin
    k, taken = 0, 0  # the part being laid out, and how much of it is already out
    while pos < stop:
        if pos % BLOCK_SIZE == 0:
            out.append(block_header(pos, begin, stop))
            pos += BLOCK_HEADER_SIZE
            continue
        room = min(BLOCK_SIZE - pos % BLOCK_SIZE, stop - pos)
        pos += room
        while room and k < len(parts):
            part = parts[k]
            take = min(room, len(part) - taken)
            out.append(part if take == len(part) else part[taken : taken + take])
            taken += take
            room -= take
            if taken == len(part):
                k, taken = k + 1, 0
        if room:
            out.append(bytes(room))
    return out


def padding_length(pos: int) -> int:
    """Physical length of the padding chunk that `padding_chunk(pos)` lays out."""
    room = remaining_in_block(pos)
    return room + BLOCK_SIZE if 0 < room < CHUNK_HEADER_SIZE else room


def padding_chunk(pos: int) -> bytes:
    """The physical padding chunk that takes `pos` to a block boundary (b"" if already on one)."""
    room = remaining_in_block(pos)
    if room == 0:
        return b""
    if room < CHUNK_HEADER_SIZE:
        room += USABLE_BLOCK_SIZE
    data = bytes(room - CHUNK_HEADER_SIZE)
    return physical_chunk(pos, encode_chunk(CHUNK_PADDING, data, 0, 0), 0)
