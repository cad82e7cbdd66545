"""A large footer read in windows and parsed into the index's columns as it arrives.

Opening a file of millions of chunks must hold what its index keeps and little else, so the
footer is never held whole (nor a second, header-stripped copy of it): its range is read in
windows of a fixed size, each window's block headers checked and stripped, and its entries
parsed by C straight into the preallocated columns, whose size is decided from the declared
count after checking it against the file and the memory budget.

A footer chunk's data is a codec byte, the record sizes block, then the values block (the
metadata record, then one entry per data chunk). The sizes come first, but canonical entries
delimit themselves, so the values are parsed without them, in three passes over the range:
one hashes the sizes block (the data hash runs over the data in order) and takes the
metadata's size from its first varint; two hashes and parses the values block; three checks
every record size against the length of the entry parsed into that row, which proves the
delimiting. The columns are returned only once the data hash matches.

Streamed are the footers writers make: uncompressed or zstd (decompressed by a stream
writer in bounded pieces, so a crafted ratio costs no memory), canonical entries. What it
holds is counted against the memory budget before it is taken: the columns, the windows
(made smaller to fit), and zstd's window (read from the frame's header first). Anything
else (another codec, an odd entry, a damaged byte, a budget too small to stream in) makes
`stream_footer` return None, and the caller reads the footer whole, as for a small one,
whose own checks decide: it parses what is valid and names what is not, so errors read the
same either way. Sans-I/O, as `index` is.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np

from .codecs import NONE, ZSTD
from .decoding import check_gap, fills_end
from .errors import ArrayRecordFormatError
from .fileindex import ones_like
from .footer import FooterData, _native
from .footerblocks import _Block, _Budget, _FirstVarint, _Refused
from .hashing import HashStream
from .layout import (
    BLOCK_HEADER_SIZE,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    CHUNK_SIMPLE,
    ChunkHeader,
    _parse_chunk_header,
    add_with_overhead,
    chunk_end,
    padding_length,
    strip_block_headers,
)
from .varint import MAX_VARINT64_BYTES, read_varint

STREAM_FROM = 1 << 20
"""Footer ranges longer than this are streamed; shorter ones are read whole."""
REMOTE_STREAM_FROM = 1 << 23
"""From a bucket, where a round trip costs more than the copy saves, a footer up to this
long is read whole (in one request, not a few windows) where the budget holds it whole."""
LOCAL_WINDOW = 1 << 18
"""Physical bytes per read of a local file (round trips are cheap)."""
REMOTE_WINDOW = 1 << 22
"""Physical bytes per read of a remote one (fewer round trips, a few MiB held)."""
MIN_WINDOW = 1 << 12
"""The smallest window streaming shrinks to under a small budget (else the footer is read
whole)."""
KEPT_PER_ENTRY = 12
"""What the index keeps per chunk of one record: its offset (int64), decoded size (uint32)."""
_WITH_COUNTS = 20  # ... and its record count (int64), when chunks hold more than one
_META_MAX = 1 << 20  # the metadata record (writer options, element spec): a few KiB

ReadRequest = tuple[int, int]
Steps = Generator[ReadRequest, "bytes | memoryview", "FooterData | None"]


def available() -> bool:
    """The C parts streaming needs are built."""
    return HashStream.available and hasattr(_native, "stream_entries")


def check_length(buf, want: int, offset: int, path: str | None) -> None:
    """A read returned exactly the bytes asked for, or the file changed under us."""
    if buf is None or len(buf) != want:
        got = 0 if buf is None else len(buf)
        raise ArrayRecordFormatError(
            f"short read: asked for {want} bytes, got {got}", path=path, offset=offset,
            hint="the object changed or was truncated while reading; re-open it",
        )


def stream_footer(footer_offset: int, size: int, *, path: str | None, check: bool,
                  max_decoded: int, window: int) -> Steps:
    """The footer at `footer_offset` of a file of `size` bytes, read `window` bytes at a
    time; None when it is not one this path takes (see the module's docstring). `check`:
    verify every block header, the chunk header and the data hash."""
    post_at = size - BLOCK_SIZE
    want = min(add_with_overhead(footer_offset, CHUNK_HEADER_SIZE + 16), post_at) - footer_offset
    raw = yield (footer_offset, want)
    check_length(raw, want, footer_offset, path)
    try:
        logical = strip_block_headers(raw, footer_offset, verify=check, path=path)
        header = _parse_chunk_header(ChunkHeader, logical, check, path, footer_offset)
        layout = _layout(header, logical, footer_offset, post_at)
    except (ArrayRecordFormatError, _Refused):
        return None
    sizes_at, values_at = layout
    m = header.num_records - 1
    codec = logical[CHUNK_HEADER_SIZE]
    budget = _Budget(max_decoded)
    try:
        budget.take(KEPT_PER_ENTRY * m + 8)
        # the windows (a read, its stripped copy, zstd's pieces), shrunk to fit; with zstd,
        # half of what is left stays for its decoder
        fit = budget.left // (3 if codec == NONE else 6)
        if fit < min(window, MIN_WINDOW):
            raise _Refused
        window = min(window, fit)
        budget.take(3 * window)
    except _Refused:
        return None
    stop = chunk_end(footer_offset, header.data_size, header.num_records)
    if stop != post_at:
        want = fills_end(stop, post_at) - stop
        gap = yield (stop, want)
        check_length(gap, want, stop, path)
        try:
            check_gap(gap, stop, post_at, footer_offset)
        except ArrayRecordFormatError:
            return None
    data_end = CHUNK_HEADER_SIZE + header.data_size
    try:
        return (yield from _passes(header, codec, sizes_at, values_at, data_end, m,
                                   footer_offset, path, check, budget, window))
    except _Refused:
        return None


def _layout(header: ChunkHeader, logical, footer_offset: int, post_at: int) -> tuple[int, int]:
    """Where (in the chunk's logical bytes) the sizes and the values blocks start; _Refused
    for a chunk this path does not take."""
    n = header.num_records
    most = (footer_offset - 64) // CHUNK_HEADER_SIZE + 1  # a chunk header per data chunk
    stop = chunk_end(footer_offset, header.data_size, n)
    if header.chunk_type != CHUNK_SIMPLE or not 2 <= n <= most or header.data_size < 2 or \
            (stop != post_at and post_at != stop + padding_length(stop)):
        raise _Refused
    head = bytes(logical[CHUNK_HEADER_SIZE : CHUNK_HEADER_SIZE + header.data_size])
    if head[0] not in (NONE, ZSTD):
        raise _Refused
    try:
        sizes_len, pos = read_varint(head, 1)
    except ArrayRecordFormatError:
        raise _Refused from None
    sizes_at = CHUNK_HEADER_SIZE + pos
    if sizes_at + sizes_len > CHUNK_HEADER_SIZE + header.data_size:
        raise _Refused
    return sizes_at, sizes_at + sizes_len


def _passes(header: ChunkHeader, codec: int, sizes_at: int, values_at: int, data_end: int,
            m: int, footer_offset: int, path: str | None, check: bool, budget: _Budget,
            window: int) -> Steps:
    """The three passes of the module's docstring; _Refused when anything is otherwise."""
    def read(a: int, b: int, sink: Callable[[memoryview, int], None]):
        return _read(footer_offset, a, b, window, check, path, sink)

    data_hash, sizes_hash = HashStream(), HashStream()
    first = _FirstVarint()
    sizes = _Block(codec, values_at - sizes_at, m + 1, (m + 1) * MAX_VARINT64_BYTES,
                   first.feed, budget=budget)

    def pass_one(piece: memoryview, at: int) -> None:
        if check:
            data_hash.update(piece)
        if at + len(piece) > sizes_at:
            part = piece[max(0, sizes_at - at):]
            if check:
                sizes_hash.update(part)
            if first.value is None:
                sizes.feed(part)

    yield from read(CHUNK_HEADER_SIZE, values_at, pass_one)
    sizes.close()
    meta_len = first.value
    if meta_len is None or meta_len > min(_META_MAX, header.decoded_data_size):
        raise _Refused
    columns = _Columns(m, footer_offset, meta_len, budget)
    decoded = header.decoded_data_size
    values = _Block(codec, data_end - values_at, decoded, decoded, columns.feed, exact=True,
                    budget=budget)

    yield from read(values_at, data_end, _hashed(data_hash if check else None, values))
    values.finish()
    values.close()
    columns.finish()
    if check and data_hash.digest() != header.data_hash:
        raise _Refused
    recheck = HashStream()
    compare = _Sizes(columns)
    sizes = _Block(codec, values_at - sizes_at, m + 1, (m + 1) * MAX_VARINT64_BYTES,
                   compare.feed, budget=budget)

    yield from read(sizes_at, values_at, _hashed(recheck if check else None, sizes))
    sizes.finish()
    sizes.close()
    compare.finish(meta_len)
    if check and recheck.digest() != sizes_hash.digest():
        raise _Refused  # the file changed between the passes
    return columns.footer()


def _hashed(hasher: HashStream | None, block: _Block) -> Callable[[memoryview, int], None]:
    """A pass that feeds each piece to `block`, hashed on the way where `hasher` is given."""
    def feed(piece: memoryview, at: int) -> None:
        if hasher is not None:
            hasher.update(piece)
        block.feed(piece)
    return feed


def _read(footer_offset: int, a: int, b: int, window: int, check: bool, path: str | None,
          sink: Callable[[memoryview, int], None]) -> Generator[ReadRequest, bytes, None]:
    """The footer chunk's logical bytes `[a, b)`, read in windows of about `window` physical
    bytes (a block header never split between two), handed to `sink(piece, logical_at)`."""
    p, end = add_with_overhead(footer_offset, a), add_with_overhead(footer_offset, b)
    at = a
    while p < end:
        q = min(end, p + window)
        if 0 < q % BLOCK_SIZE < BLOCK_HEADER_SIZE:
            q += BLOCK_HEADER_SIZE - q % BLOCK_SIZE
        raw = yield (p, q - p)
        check_length(raw, q - p, p, path)
        try:
            piece = strip_block_headers(raw, p, verify=check, path=path)
        except ArrayRecordFormatError:
            raise _Refused from None
        sink(piece, at)
        at += len(piece)
        p = q


class _Columns:
    """The values block after the metadata record, parsed into the index's columns (rows of
    a chunk offset, its decoded size, and its record count once one is not 1)."""

    def __init__(self, m: int, footer_offset: int, meta_len: int, budget: _Budget) -> None:
        self.m, self.footer_offset, self.budget = m, footer_offset, budget
        self.bounds = np.empty(m + 1, dtype=np.int64)  # the offsets, then the footer's
        self.bounds[m] = footer_offset
        self.offsets = self.bounds[:m]
        self.decoded = np.empty(m, dtype=np.uint32)
        self.records: np.ndarray | None = None
        self.state = np.zeros(6, dtype=np.int64)
        self.meta_len, self.meta = meta_len, b""
        self.left = b""  # the start of an entry that the next piece ends

    def feed(self, piece: memoryview) -> None:
        if len(self.meta) < self.meta_len:
            take = self.meta_len - len(self.meta)
            self.meta += bytes(piece[:take])
            piece = piece[take:]
        while len(piece):
            if not self.left:
                used = self._parse(piece)
                self.left = bytes(piece[used:])
                return
            head = piece[:64]  # an entry takes at most 30 bytes
            buf = self.left + bytes(head)
            used = self._parse(buf)
            if used < len(self.left):  # no entry ended in `head`: all of buf starts one
                self.left, piece = buf, piece[len(head) :]
            else:
                self.left, piece = b"", piece[used - len(self.left) :]

    def _parse(self, buf) -> int:
        used = _native.stream_entries(buf, self.footer_offset, self.offsets, self.decoded,
                                      self.records, self.state)
        status = int(self.state[5])
        if status == 2:  # a chunk of several records: keep the counts from here on
            self.budget.take((_WITH_COUNTS - KEPT_PER_ENTRY) * self.m)
            self.records = np.ones(self.m, dtype=np.int64)
            self.state[5] = 0
            return used + self._parse(memoryview(buf)[used:])
        if status:
            raise _Refused
        return used

    def finish(self) -> None:
        k = int(self.state[0])
        last = self.footer_offset - int(self.offsets[-1]) if k else 0
        if len(self.meta) != self.meta_len or self.left or k != self.m or (
                self.records is not None and int(self.records[-1]) > last):
            raise _Refused

    def footer(self) -> FooterData:
        _, _, total, most, widest, _ = (int(v) for v in self.state)
        counts = self.records if self.records is not None else ones_like(self.offsets)
        return FooterData(self.meta, self.offsets, self.decoded, counts,
                          checked=(total, most, widest))


class _Sizes:
    """The record sizes after the metadata's, each checked against the length of the entry
    parsed into its row (`stream_sizes`)."""

    def __init__(self, columns: _Columns) -> None:
        self.columns = columns
        self.state = np.array([0, columns.m, 0], dtype=np.int64)
        self.first = _FirstVarint()
        self.left = b""

    def feed(self, piece: memoryview) -> None:
        if self.first.value is None:  # the metadata's size, which the first pass took
            piece = piece[self.first.feed(piece) :]
            if self.first.value is None:
                return
        c = self.columns
        while len(piece):
            buf = self.left + bytes(piece[:16]) if self.left else piece
            used = _native.stream_sizes(buf, c.offsets, c.decoded, c.records, self.state)
            if self.state[2]:
                raise _Refused
            if not self.left:
                self.left = bytes(piece[used:])
                return
            if used < len(self.left):
                self.left, piece = bytes(buf), piece[16:]
            else:
                self.left, piece = b"", piece[used - len(self.left) :]

    def finish(self, meta_len: int) -> None:
        if self.left or self.first.value != meta_len or int(self.state[0]) != self.columns.m:
            raise _Refused
