"""Simple chunks ('r'): a codec byte, a block of record sizes and a block of record bytes.

`decode_simple` returns the decoded values buffer plus record boundaries, so records are
zero-copy slices; it never loops over records in Python. See ARRAYRECORD_FORMAT.md §7.3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .codecs import Compression, decompress_block
from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .hashing import highwayhash64
from .layout import CHUNK_SIMPLE, CHUNK_TRANSPOSED, ChunkHeader
from .varint import (
    MAX_VARINT64_BYTES,
    decode_varints,
    encode_varint,
    encode_varints,
    read_varint,
)

TRANSPOSE_HINT = (
    "the file was written with the 'transpose' option, which aioloader does not decode; "
    "rewrite it without transpose, e.g. `aioloader convert` or array_record's "
    "ArrayRecordWriter(path, 'group_size:1')"
)


@dataclass(frozen=True, slots=True)
class ChunkRecords:
    """The records of one decoded chunk: record j is `values[bounds[j]:bounds[j+1]]`."""

    values: memoryview
    bounds: np.ndarray  # int64, num_records + 1 entries, starting at 0

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def record(self, j: int) -> bytes:
        return bytes(self.values[self.bounds[j] : self.bounds[j + 1]])

    def view(self, j: int) -> memoryview:
        return self.values[self.bounds[j] : self.bounds[j + 1]]

    def records(self) -> list[bytes]:
        v, b = self.values, self.bounds.tolist()
        return [bytes(v[b[j] : b[j + 1]]) for j in range(len(b) - 1)]


def decode_simple(header: ChunkHeader, data) -> ChunkRecords:
    """Decode the data of a simple chunk whose header was already parsed."""
    if header.chunk_type == CHUNK_TRANSPOSED:
        raise ArrayRecordFormatError("transposed chunk", hint=TRANSPOSE_HINT)
    if header.chunk_type != CHUNK_SIMPLE:
        raise ArrayRecordFormatError(
            f"chunk type 0x{header.chunk_type:02x} where a simple chunk ('r') was expected"
        )
    n = header.num_records
    if len(data) < 2:
        raise ArrayRecordFormatError("simple chunk data shorter than 2 bytes")
    codec = data[0]
    sizes_len, pos = read_varint(data, 1)
    if pos + sizes_len > len(data):
        raise ArrayRecordFormatError(
            f"sizes block of {sizes_len} bytes runs past the chunk data ({len(data)} bytes)"
        )
    values = decompress_block(
        codec, data[pos + sizes_len :], header.decoded_data_size, header.decoded_data_size
    )
    if n == 1:  # group_size 1: the only record is the whole values block
        return ChunkRecords(values, np.array([0, len(values)], dtype=np.int64))
    sizes = decompress_block(codec, data[pos : pos + sizes_len], None, n * MAX_VARINT64_BYTES)
    lengths = decode_varints(sizes, n)
    bounds = np.zeros(n + 1, dtype=np.int64)
    if n:
        if int(lengths.max()) > header.decoded_data_size:
            raise ArrayRecordFormatError("a record size exceeds the chunk's decoded size")
        np.cumsum(lengths, out=bounds[1:], dtype=np.int64)
    if bounds[-1] != header.decoded_data_size:
        raise ArrayRecordFormatError(
            f"record sizes add up to {int(bounds[-1])} bytes, header says "
            f"{header.decoded_data_size}"
        )
    return ChunkRecords(values, bounds)


def encode_simple(records: list, compression: Compression) -> tuple[bytes, int]:
    """Encode records as simple-chunk data; return (data, decoded_data_size)."""
    lengths = [len(r) for r in records]
    values = b"".join(records)
    sizes_block = compression.compress_block(encode_varints(lengths))
    values_block = compression.compress_block(values)
    data = bytes((compression.codec,)) + encode_varint(len(sizes_block)) + sizes_block
    return data + values_block, len(values)


def verify_data(header: ChunkHeader, data) -> None:
    if highwayhash64(data) != header.data_hash:
        raise ArrayRecordFormatError(
            "chunk data hash mismatch",
            hint=CORRUPT_HINT,
        )

