"""The four tiny proto2 messages of ArrayRecord's footer and postscript, without protobuf.

Footers of files written with group_size 1 hold one entry per record (millions of them), so
the entries are decoded in bulk with NumPy when they have the usual all-varint shape, and
field by field otherwise.
"""

from __future__ import annotations

import numpy as np

from .errors import ArrayRecordFormatError
from .varint import decode_varints, encode_varint, read_varint

POSTSCRIPT_MAGIC = 0x71930E704FDAE05E
ELEMENT_SPEC_FIELD = 1818
"""`ArrayRecordMetadata` field of aioloader's element spec (JSON; `aioloader.elements.typed`):
unknown to array_record, which keeps reading the file; far above its own fields (1-4)."""


def iter_fields(buf):
    """Yield (field number, wire type, value) of one message, in order; varints and fixed
    widths as int, length-delimited as bytes (a repeated field yields each of its values)."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ArrayRecordFormatError("protobuf field number 0")
        if wire == 0:
            value, pos = read_varint(buf, pos, end)
        elif wire == 2:
            n, pos = read_varint(buf, pos, end)
            if pos + n > end:
                raise ArrayRecordFormatError("protobuf field runs past its message")
            value = bytes(buf[pos : pos + n])
            pos += n
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > end:
                raise ArrayRecordFormatError("protobuf field runs past its message")
            value = int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        else:
            raise ArrayRecordFormatError(f"protobuf wire type {wire} is not supported")
        yield number, wire, value


def parse_fields(buf) -> dict[int, int | bytes]:
    """Parse one message into {field number: last value}; varints as int, bytes as bytes."""
    return {number: value for number, _, value in iter_fields(buf)}


def _varint_field(number: int, value: int) -> bytes:
    return encode_varint(number << 3) + encode_varint(value)


def _bytes_field(number: int, value: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value


def encode_postscript(footer_offset: int) -> bytes:
    return _varint_field(1, footer_offset) + _varint_field(2, POSTSCRIPT_MAGIC)


def encode_metadata(num_chunks: int, num_records: int, writer_options: str,
                    extra: dict[int, bytes] | None = None) -> bytes:
    """`RiegeliFooterMetadata{array_record_metadata{...}}`; `extra`: more length-delimited
    fields of `ArrayRecordMetadata` (unknown to array_record, which skips them)."""
    inner = (
        _varint_field(1, 1)
        + _varint_field(2, num_chunks)
        + _varint_field(3, num_records)
        + _bytes_field(4, writer_options.encode())
        + b"".join(_bytes_field(n, v) for n, v in sorted((extra or {}).items()))
    )
    return _bytes_field(1, inner)


def encode_footer_entry(chunk_offset: int, decoded_data_size: int, num_records: int) -> bytes:
    return (
        _varint_field(1, chunk_offset)
        + _varint_field(2, decoded_data_size)
        + _varint_field(3, num_records)
    )


_ENTRIES_AT_ONCE = 1 << 16  # bounds the bulk decoder's temporaries (~300 bytes an entry)


def decode_footer_entries(values, bounds: np.ndarray) -> np.ndarray:
    """Decode `ArrayRecordFooter` messages laid back to back in `values`.

    `bounds[k]..bounds[k+1]` is entry k. Returns an int64 array of shape (n, 3): chunk offset,
    decoded data size, record count (0 where a field is absent). Entries are decoded a slice
    at a time, so the memory beyond the result stays small for millions of them.
    """
    n = len(bounds) - 1
    out = np.zeros((max(n, 0), 3), dtype=np.int64)
    for lo in range(0, n, _ENTRIES_AT_ONCE):
        hi = min(n, lo + _ENTRIES_AT_ONCE)
        part = bounds[lo : hi + 1]
        try:
            out[lo:hi] = _decode_entries_bulk(values, part)
        except _NotBulk:
            _decode_entries_slow(values, part, out[lo:hi], lo)
    return out


def _decode_entries_slow(values, bounds, out: np.ndarray, first: int) -> None:
    for k in range(len(bounds) - 1):
        fields = parse_fields(values[bounds[k] : bounds[k + 1]])
        if 1 not in fields:
            raise ArrayRecordFormatError(f"footer entry {first + k} has no chunk_offset")
        for col, number in enumerate((1, 2, 3)):
            value = fields.get(number, 0)
            if not isinstance(value, int) or value >= 1 << 63:
                raise ArrayRecordFormatError(
                    f"footer entry {first + k} field {number} is malformed")
            out[k, col] = value


class _NotBulk(Exception):
    pass


def _decode_entries_bulk(values, bounds: np.ndarray) -> np.ndarray:
    """Fast path: every entry is exactly fields 1, 2, 3 as varints, in order."""
    arr = np.frombuffer(values, dtype=np.uint8)[bounds[0] : bounds[-1]]
    count = int(np.count_nonzero(arr < 0x80))
    n = len(bounds) - 1
    if count != 6 * n:
        raise _NotBulk
    try:
        v = decode_varints(arr, count).reshape(n, 6)
    except ArrayRecordFormatError:
        raise _NotBulk from None
    if not ((v[:, 0] == 8).all() and (v[:, 2] == 16).all() and (v[:, 4] == 24).all()):
        raise _NotBulk
    # The entries' own sizes must agree with the sizes block; otherwise use the slow path.
    ends = np.flatnonzero(arr < 0x80)[5::6] + 1
    if not np.array_equal(ends, np.asarray(bounds[1:]) - bounds[0]):
        raise _NotBulk
    fields = v[:, 1::2]
    if (fields >= np.uint64(1 << 63)).any():
        raise _NotBulk
    return fields.astype(np.int64)
