"""Simple chunks ('r'): a codec byte, a block of record sizes and a block of record bytes.

`decode_simple` returns the decoded values buffer plus record boundaries, so records are
zero-copy slices; it never loops over records in Python. See ARRAYRECORD_FORMAT.md §7.3.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from .codecs import NONE, Compression, _decompress, decompress_block
from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .hashing import highwayhash64
from .layout import CHUNK_SIMPLE, CHUNK_TRANSPOSED, ChunkHeader
from .levels import DEFAULT_MAX_DECODED
from .levels import DEFAULT_VERIFY as DEFAULT_VERIFY  # (re-exported for its importers)
from .varint import (
    MAX_VARINT64_BYTES,
    decode_varints,
    encode_varint,
    encode_varints,
    read_varint,
)

TRANSPOSE_HINT = (
    "a transposed chunk is decoded by arrayrecord.transposed.decode_transposed "
    "(decode_chunk dispatches on the chunk type), not as a simple chunk"
)


class ChunkRecords:
    """The records of one decoded chunk: record j is `values[bounds[j]:bounds[j+1]]`.

    `ChunkRecords(values, bounds)` with `bounds` an int64 array of `num_records + 1` entries
    starting at 0. A one-record chunk (group_size 1, the common case) is built without a bounds
    array (it is made on first use of `.bounds`), and its `record(0)` returns the decompressed
    `bytes` object itself instead of copying it. `values` and `bounds` are read-only.
    """

    __slots__ = ("_bounds", "_single", "_values", "_whole")

    def __init__(self, values: memoryview, bounds: np.ndarray) -> None:
        self._values = values
        self._bounds: Any = bounds  # an ndarray, or None in a one-record chunk until used
        self._single = False
        self._whole: bytes | None = None

    @classmethod
    def _one(cls, values: memoryview, whole: bytes | None) -> ChunkRecords:
        """One record spanning all of `values`; `whole` is the same bytes, if it is `bytes`."""
        self = _new(cls)
        self._values = values
        self._bounds = None
        self._single = True
        self._whole = whole
        return self

    values = property(attrgetter("_values"), doc="The decoded values block (a memoryview).")

    @property
    def bounds(self) -> np.ndarray:
        """Record boundaries: int64, num_records + 1 entries, starting at 0."""
        b = self._bounds
        if b is None:
            b = self._bounds = np.array([0, len(self._values)], dtype=np.int64)
        return b

    def __len__(self) -> int:
        return 1 if self._single else len(self._bounds) - 1

    def __repr__(self) -> str:
        return f"ChunkRecords(values={self._values!r}, bounds={self.bounds!r})"

    def record(self, j: int) -> bytes:
        if self._single and j == 0:
            whole = self._whole
            return whole if whole is not None else bytes(self._values)
        b = self.bounds
        return bytes(self._values[b[j] : b[j + 1]])

    def view(self, j: int) -> memoryview:
        if self._single and j == 0:
            return self._values[:]
        b = self.bounds
        return self._values[b[j] : b[j + 1]]

    def records(self) -> list[bytes]:
        if self._single:
            return [self.record(0)]
        v, b = self._values, self._bounds.tolist()
        return [bytes(v[b[j] : b[j + 1]]) for j in range(len(b) - 1)]


_new = object.__new__

RECORD_COST = 48
"""Bytes per record of the index arrays built while decoding a chunk (sizes, bounds)."""


def decode_simple(header: ChunkHeader, data, max_decoded: int = DEFAULT_MAX_DECODED
                  ) -> ChunkRecords:
    """Decode the data of a simple chunk whose header was already parsed.

    Nothing is allocated before the header's claims are checked against `max_decoded` (the
    bytes one chunk may decode to, its index arrays included) and the sizes block, whose
    varints (at least a byte per record) bound the record count.
    """
    if header.chunk_type != CHUNK_SIMPLE:
        if header.chunk_type == CHUNK_TRANSPOSED:
            raise ArrayRecordFormatError("transposed chunk", hint=TRANSPOSE_HINT)
        raise ArrayRecordFormatError(
            f"chunk type 0x{header.chunk_type:02x} where a simple chunk ('r') was expected"
        )
    n = header.num_records
    decoded_size = header.decoded_data_size
    check_budget(n, decoded_size, max_decoded)
    if len(data) < 2:
        raise ArrayRecordFormatError("simple chunk data shorter than 2 bytes")
    codec = data[0]
    sizes_len, pos = data[1], 2
    if sizes_len >= 0x80:  # a one-byte varint (< 128) is the common case
        sizes_len, pos = read_varint(data, 1)
    if pos + sizes_len > len(data):
        raise ArrayRecordFormatError(
            f"sizes block of {sizes_len} bytes runs past the chunk data ({len(data)} bytes)"
        )
    sizes_block, values_block = data[pos : pos + sizes_len], data[pos + sizes_len :]
    if n == 1:  # group_size 1: the only record is the whole values block
        head = ONE_RECORD_HEADS.get(decoded_size)
        if head is None or data[: len(head)] != head or len(head) != pos + sizes_len:
            check_one_size(codec, sizes_block, decoded_size)
            _remember(decoded_size, data[: pos + sizes_len])
        out = _decompress(codec, values_block, decoded_size, decoded_size)
        values = out if codec == NONE else memoryview(out)
        return ChunkRecords._one(values, out if type(out) is bytes else None)
    bounds = record_bounds(codec, sizes_block, n, decoded_size, max_decoded)
    values = decompress_block(codec, values_block, decoded_size, decoded_size)
    return ChunkRecords(values, bounds)


def simple_parts(header: ChunkHeader, data, max_decoded: int = DEFAULT_MAX_DECODED
                 ) -> tuple[int, np.ndarray, Any]:
    """A simple chunk's codec, record bounds (checked against the header) and still
    compressed values block: what `decode_simple` decodes whole, for callers that decode
    only part of the values (`aioloader.workers.extract`). Checks what `decode_simple`
    checks, the budget first."""
    if header.chunk_type != CHUNK_SIMPLE:
        raise ArrayRecordFormatError(
            f"chunk type 0x{header.chunk_type:02x} where a simple chunk ('r') was expected")
    n, decoded_size = header.num_records, header.decoded_data_size
    check_budget(n, decoded_size, max_decoded)
    codec, sizes_block, values_block = split_simple(data)
    bounds = record_bounds(codec, sizes_block, n, decoded_size, max_decoded)
    return codec, bounds, values_block


def split_simple(data: Any) -> tuple[int, Any, Any]:
    """A simple chunk's codec byte, its (compressed) sizes block and its values block, the
    sizes block checked to lie within `data`. (`decode_simple` inlines this: it runs once a
    record on group-size-1 files.)"""
    if len(data) < 2:
        raise ArrayRecordFormatError("simple chunk data shorter than 2 bytes")
    sizes_len, pos = read_varint(data, 1)
    if pos + sizes_len > len(data):
        raise ArrayRecordFormatError(
            f"sizes block of {sizes_len} bytes runs past the chunk data ({len(data)} bytes)"
        )
    return data[0], data[pos : pos + sizes_len], data[pos + sizes_len :]


def record_bounds(codec: int, sizes_block, n: int, decoded_size: int,
                  max_decoded: int) -> np.ndarray:
    """The `n + 1` record boundaries a sizes block gives, which must end at `decoded_size`."""
    sizes = decompress_block(codec, sizes_block, None,
                             min(n * MAX_VARINT64_BYTES, max_decoded))
    lengths = decode_varints(sizes, n)
    bounds = np.zeros(n + 1, dtype=np.int64)
    if n:
        if int(lengths.max()) > decoded_size:
            raise ArrayRecordFormatError("a record size exceeds the chunk's decoded size")
        np.cumsum(lengths, out=bounds[1:], dtype=np.int64)
    if bounds[-1] != decoded_size:
        raise ArrayRecordFormatError(
            f"record sizes add up to {int(bounds[-1])} bytes, header says {decoded_size}"
        )
    return bounds


def check_budget(num_records: int, decoded_size: int, max_decoded: int) -> None:
    """Refuse a chunk whose declared size would take more than `max_decoded` bytes to decode
    (its values plus `RECORD_COST` per record), before anything is allocated for it."""
    if decoded_size + RECORD_COST * num_records > max_decoded:
        raise ArrayRecordFormatError(
            f"chunk declares {num_records} records and {decoded_size} decoded bytes, more "
            f"than the memory budget of {max_decoded} bytes allows",
            hint="the file is corrupted or crafted; if it is genuine, raise the budget (the "
                 "loader's memory_budget, or max_decoded)",
        )


ONE_RECORD_HEADS: dict[int, bytes] = {}
"""Record size -> the start of a one-record chunk's data (codec byte, sizes length, sizes
block) last seen to hold just that size. A group_size 1 file repeats a few record sizes, each
encoded the same way, so checking its sizes block costs a lookup and a comparison."""
_HEADS = 1 << 14


def check_one_size(codec: int, block, size: int) -> None:
    """The sizes block of a one-record chunk must hold exactly one varint, `size`."""
    sizes = bytes(block) if codec == NONE else bytes(_decompress(codec, block, None,
                                                                 MAX_VARINT64_BYTES))
    got, end = read_varint(sizes, 0)
    if end != len(sizes) or got != size:
        raise ArrayRecordFormatError(
            f"the sizes block does not hold the one record size {size} the header declares"
        )


def one_record_head(data, size: int) -> bytes:
    """The head of a one-record chunk's `data` (up to its values block), once its sizes block
    is checked to hold just `size`; remembered in `ONE_RECORD_HEADS`."""
    sizes_len = data[1]
    if sizes_len >= 0x80 or 2 + sizes_len > len(data):  # not the one-byte-length shape
        raise ArrayRecordFormatError("unexpected sizes block")  # the caller falls back
    check_one_size(data[0], data[2 : 2 + sizes_len], size)
    return _remember(size, data[: 2 + sizes_len])


def _remember(size: int, head) -> bytes:
    head = bytes(head)
    if len(ONE_RECORD_HEADS) < _HEADS:
        ONE_RECORD_HEADS[size] = head
    return head


def encode_simple(records: list, compression: Compression) -> tuple[bytes, int]:
    """Encode records as simple-chunk data; return (data, decoded_data_size)."""
    lengths = [len(r) for r in records]
    if len(lengths) <= 64:  # skip NumPy for small groups; same bytes as encode_varints
        sizes = (bytes(lengths) if not lengths or max(lengths) < 0x80
                 else b"".join([encode_varint(n) for n in lengths]))
    else:
        sizes = encode_varints(lengths)
    sizes_block = compression.compress_block(sizes)
    head = bytes((compression.codec,)) + encode_varint(len(sizes_block)) + sizes_block
    if compression.codec == NONE:  # the values block is the records themselves: one copy
        data = b"".join([head, *records])
        return data, len(data) - len(head)
    values = b"".join(records)
    prefix, stream = compression._compress_parts(values)
    return b"".join((head, prefix, stream)), len(values)


def verify_data(header: ChunkHeader, data) -> None:
    if highwayhash64(data) != header.data_hash:
        raise ArrayRecordFormatError(
            "chunk data hash mismatch",
            hint=CORRUPT_HINT,
        )

