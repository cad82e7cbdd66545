"""Decode a footer chunk straight into the index's columns, lean enough for millions of chunks.

The footer is one simple chunk: a metadata record, then one `ArrayRecordFooter` entry per data
chunk (offset, decoded size, record count). Decoding it as generic records costs 48 bytes per
entry in bounds and sizes before the entries themselves (24 more, then copied into columns),
and NumPy is slow on the tens of millions of varints of a group_size 1 file
(docs/performance.md). Here the record sizes are turned into record ends in place, and the
entries are parsed by a small C loop (`_footer.c`; a NumPy fallback decodes a slice at a time
when it is not built): at most 40 bytes per chunk while decoding.

The same checks as the generic decoder hold (the header's claims are checked against the
budget before anything is allocated; record sizes must add up to the decoded size; each
entry's own length must match its record size, else the slow path parses it or says why).
"""

from __future__ import annotations

import numpy as np

from .chunk import decode_simple, split_simple
from .codecs import decompress_block
from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .fileindex import ones_like
from .layout import CHUNK_SIMPLE, ChunkHeader
from .proto import _ENTRIES_AT_ONCE, _decode_entries_bulk, _decode_entries_slow, _NotBulk
from .varint import MAX_VARINT64_BYTES, decode_varints

try:
    from . import _footer as _native
except ImportError:  # no compiler at install: NumPy decodes them (slower, same answers)
    _native = None  # type: ignore[assignment]

FOOTER_COST = 40
"""Bytes per footer entry while decoding: record ends (8), three columns (24), sizes (≤ 8)."""


class FooterData:
    """The footer's metadata record and its entries as columns (one row per data chunk).

    `checked`, when not None, says the entries were already checked against the file (see
    `decode_footer_data`'s `footer_offset`): (records in all chunks, most in one chunk,
    largest decoded size)."""

    __slots__ = ("checked", "decoded", "metadata", "offsets", "records")

    def __init__(self, metadata: bytes, offsets: np.ndarray, decoded: np.ndarray,
                 records: np.ndarray, checked: tuple[int, int, int] | None = None) -> None:
        self.metadata = metadata
        self.offsets = offsets
        self.decoded = decoded
        self.records = records
        self.checked = checked


def decode_footer_data(header: ChunkHeader, data, max_decoded: int,
                       footer_offset: int | None = None) -> FooterData:
    """Decode a footer chunk's data (its header already parsed and checked).

    With `footer_offset` (where the footer starts), the C parser reads the usual footer in one
    call and checks its entries against the file too (`_footer.columns`; `checked` says so);
    anything else takes the general path below, which leaves those checks to the caller."""
    n = header.num_records
    if header.chunk_type != CHUNK_SIMPLE or n < 2:  # the generic decoder says what is wrong
        chunk = decode_simple(header, data, max_decoded)
        if len(chunk) == 0:
            raise ArrayRecordFormatError("footer holds no metadata record", hint=CORRUPT_HINT)
        z = np.zeros(0, dtype=np.int64)
        return FooterData(bytes(chunk.view(0)), z, z.copy(), z.copy())
    decoded_size = header.decoded_data_size
    if decoded_size + FOOTER_COST * n > max_decoded:
        raise ArrayRecordFormatError(
            f"footer declares {n} records and {decoded_size} decoded bytes, more than the "
            f"memory budget of {max_decoded} bytes allows",
            hint="the file is corrupted or crafted; if it is genuine, raise the budget (the "
                 "loader's memory_budget, or max_decoded)",
        )
    codec, sizes_block, values_block = split_simple(data)
    sizes = decompress_block(codec, sizes_block, None, min(n * MAX_VARINT64_BYTES, max_decoded))
    values = None
    columns = getattr(_native, "columns", None) if footer_offset is not None else None
    if columns is not None:  # (a _footer built before `columns` was added lacks it)
        try:
            values = decompress_block(codec, values_block, decoded_size, decoded_size)
        except ArrayRecordFormatError:  # the general path below says what, in its order
            columns = values = None
    if columns is not None and values is not None and footer_offset is not None:
        got = _lean(sizes, values, footer_offset, n - 1)
        if got is not None:
            return got
        offsets, decoded, records = (np.empty(n - 1, dtype=np.int64) for _ in range(3))
        summary = columns(sizes, values, footer_offset, offsets, decoded, records)
        if summary is not None:
            meta_len, total, most, widest = summary
            return FooterData(bytes(memoryview(values)[:meta_len]), offsets, decoded, records,
                              checked=(total, most, widest))
    ends = decode_varints(sizes, n)
    del sizes
    if int(ends.max()) > decoded_size:
        raise ArrayRecordFormatError("a record size exceeds the chunk's decoded size")
    ends = ends.view(np.int64)
    np.cumsum(ends, out=ends)  # record k ends at ends[k]; each is at most decoded_size
    if ends[-1] != decoded_size:
        raise ArrayRecordFormatError(
            f"record sizes add up to {int(ends[-1])} bytes, header says {decoded_size}"
        )
    if values is None:
        values = decompress_block(codec, values_block, decoded_size, decoded_size)
    metadata = bytes(memoryview(values)[: int(ends[0])])
    return FooterData(metadata, *_entries(values, ends))


def _lean(sizes, values, footer_offset: int, m: int) -> FooterData | None:
    """The usual group_size 1 footer as only what the index keeps: the chunk offsets as a
    prefix view of an int64 array that ends with `footer_offset` (the record table's chunk
    boundaries, see `FileIndex.bounds`), the decoded sizes as uint32, no record counts (a
    broadcast of 1). None when the extension predates it, or the footer is otherwise."""
    lean = getattr(_native, "lean_columns", None)
    if lean is None or m == 0:
        return None
    bounds = np.empty(m + 1, dtype=np.int64)
    bounds[m] = footer_offset
    offsets, decoded = bounds[:m], np.empty(m, dtype=np.uint32)
    summary = lean(sizes, values, footer_offset, offsets, decoded, None)
    if summary is None:
        return None
    meta_len, total, most, widest = summary
    return FooterData(bytes(memoryview(values)[:meta_len]), offsets, decoded,
                      ones_like(offsets), checked=(total, most, widest))


def _entries(values, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entries as columns (offsets, decoded sizes, record counts): entry k is record
    k + 1, bytes ends[k] .. ends[k + 1] of `values`; C parses the canonical form."""
    m = len(ends) - 1
    offsets, decoded, records = (np.empty(m, dtype=np.int64) for _ in range(3))
    first = 0  # the canonical form in C; the rest (if any) below
    if _native is not None:
        first = _native.entries(values, ends, offsets, decoded, records)
    for lo in range(first, m, _ENTRIES_AT_ONCE):
        hi = min(m, lo + _ENTRIES_AT_ONCE)
        part = ends[lo : hi + 1]
        try:
            got = _decode_entries_bulk(values, part)
        except _NotBulk:
            got = np.zeros((hi - lo, 3), dtype=np.int64)
            _decode_entries_slow(values, part, got, lo)
        offsets[lo:hi], decoded[lo:hi], records[lo:hi] = got[:, 0], got[:, 1], got[:, 2]
    return offsets, decoded, records
