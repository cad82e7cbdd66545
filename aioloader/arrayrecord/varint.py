"""Protobuf-style base-128 varints: one at a time for headers, vectorized for record sizes.

The sizes block of a chunk holds one varint per record; decoding it with a Python loop
would cost a microsecond per record on the hot path, so `decode_varints` does it with a
handful of NumPy passes (one per byte of the longest varint), or one when every varint
is two bytes long; a few bytes of mixed lengths are looped over (each pass's fixed cost
would outweigh the loop).
"""

from __future__ import annotations

import numpy as np

from .errors import ArrayRecordFormatError

MAX_VARINT64_BYTES = 10
SMALL_VARINTS = 160  # bytes up to which `decode_varints` loops in Python (see `_decode_small`)


def encode_varint(value: int) -> bytes:
    """Encode one unsigned integer (< 2**64)."""
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(buf, pos: int, end: int | None = None) -> tuple[int, int]:
    """Decode one varint at `buf[pos:]`; return (value, position after it)."""
    if end is None:
        end = len(buf)
    result = 0
    shift = 0
    first = pos
    if pos < end:  # one or two bytes (< 16 KiB), the common cases, without the loop
        byte = buf[pos]
        if byte < 0x80:
            return byte, pos + 1
        if pos + 1 < end:
            second = buf[pos + 1]
            if second < 0x80:
                return (byte & 0x7F) | (second << 7), pos + 2
            result = (byte & 0x7F) | ((second & 0x7F) << 7)
            shift = 14
            first = pos + 2
    for i in range(first, min(end, pos + MAX_VARINT64_BYTES)):
        byte = buf[i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, i + 1
        shift += 7
    if end - pos >= MAX_VARINT64_BYTES:
        raise ArrayRecordFormatError("varint longer than 10 bytes", offset=pos)
    raise ArrayRecordFormatError("varint runs past the end of its block", offset=pos)


def decode_varints(buf, count: int) -> np.ndarray:
    """Decode exactly `count` varints that make up all of `buf`; return uint64 values."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    if count == 0:
        if arr.size:
            raise ArrayRecordFormatError(f"{arr.size} stray bytes after 0 varints")
        return np.zeros(0, dtype=np.uint64)
    if arr.size == count:  # every value < 128: the common case for tiny records
        if arr.max(initial=0) >= 0x80:
            raise ArrayRecordFormatError("varints are truncated")
        return arr.astype(np.uint64)
    if arr.size == 2 * count:  # every value in [128, 16384) (records of 128 B to 16 KiB)?
        pairs = arr.view("<u2")
        if not ((pairs & 0x8080) != 0x0080).any():  # each: a continued byte, then a last
            return ((pairs & 0x7F) | (pairs >> 8 << 7)).astype(np.uint64)
    if arr.size <= SMALL_VARINTS:
        return _decode_small(arr, count)
    return _decode_passes(arr, count)


def _decode_passes(arr: np.ndarray, count: int) -> np.ndarray:
    """`decode_varints` of bytes `arr`, one NumPy pass per byte of the longest varint."""
    ends = np.flatnonzero(arr < 0x80)
    if ends.size != count or ends[-1] != arr.size - 1:
        raise ArrayRecordFormatError(
            f"expected {count} varints in {arr.size} bytes, found {ends.size}"
            + ("" if ends.size == 0 or ends[-1] == arr.size - 1 else " and a truncated one")
        )
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > MAX_VARINT64_BYTES:
        raise ArrayRecordFormatError("varint longer than 10 bytes")
    values = (arr[starts] & 0x7F).astype(np.uint64)
    for k in range(1, longest):
        sel = np.flatnonzero(lengths > k)
        values[sel] |= (arr[starts[sel] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values


def _decode_small(arr: np.ndarray, count: int) -> np.ndarray:
    """`decode_varints` of a few bytes `arr`, with a Python loop: NumPy's passes cost more
    than the loop here (a group-size-64 chunk's sizes block, decoded once per chunk read)."""
    out: list[int] = []
    append = out.append
    value = shift = 0
    for byte in arr.tobytes():
        if byte < 0x80:
            append((value | byte << shift) & 0xFFFFFFFFFFFFFFFF)
            value = shift = 0
        elif shift == 7 * (MAX_VARINT64_BYTES - 1):
            raise ArrayRecordFormatError("varint longer than 10 bytes")
        else:
            value |= (byte & 0x7F) << shift
            shift += 7
    if len(out) != count or shift:
        raise ArrayRecordFormatError(
            f"expected {count} varints in {arr.size} bytes, found {len(out)}"
            + (" and a truncated one" if shift else ""))
    return np.array(out, dtype=np.uint64)


def encode_varints(values) -> bytes:
    """Encode a sequence of unsigned integers back to back."""
    vals = np.asarray(values, dtype=np.uint64)
    if vals.size and int(vals.max()) < 0x80:
        return vals.astype(np.uint8).tobytes()
    return b"".join(encode_varint(int(v)) for v in vals)
