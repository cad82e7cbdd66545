"""One-record chunks (group_size 1, the layout of shuffled training data), decoded inline.

`decode_chunk` decodes any chunk in eight calls and a few objects; a one-record simple chunk
needs a header unpack, a cached comparison of its sizes block and one decompression. This
module is that short path, with the same checks, for callers that decode many such chunks
(`index.decode_records`, the workers' `Decoder`): whatever it does not accept it leaves to
the general path (it returns None), which decodes it or names the error. It never returns a
record the general path would not.

A chunk's range may cross block boundaries (any record over ~64 KiB does, images do): its
block headers are cut out into a reused buffer (`strip_into`), or never read at all
(`read_plan`: a `preadv` puts them aside), and their hashes are checked like the general
path checks them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .chunk import _HEADS, ONE_RECORD_HEADS, one_record_head
from .codecs import _MAX_RATIO, NONE, ZSTD, _frame_content_size
from .hashing import highwayhash64
from .layout import (
    _HEADER,
    BLOCK_HEADER_SIZE,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    CHUNK_SIMPLE,
)
from .varint import read_varint

_read_chunks: Callable[..., list] | None
try:  # the loop over a task's chunks, in C (optional: `read_chunks` says when absent)
    from ._onerecords import read_chunks as _read_chunks
except ImportError:  # pragma: no cover - a build without a C compiler
    _read_chunks = None

ONE_SIMPLE = CHUNK_SIMPLE | 1 << 8  # a simple chunk of one record, as the header packs it
_ZSTD_RATIO = _MAX_RATIO[ZSTD]
_U64 = struct.Struct("<Q").unpack_from
MAX_HEADERS = 64
"""Block headers a range may cross on the short paths (a ~4 MiB record); longer ranges take
the general path (a `preadv` takes at most IOV_MAX buffers, and the copy matters less)."""


def one_record(logical, budget: int, hashes: bool, data_hashes: bool, dctx, out=None):
    """The record of the one-record simple chunk that `logical` (a memoryview: chunk header
    and data, block headers removed) holds exactly, or None (or an exception) when it is
    anything else, or anything is wrong with it: the caller's general path then decides.

    `budget` is the most bytes the record may decode to, `hashes` says to check the chunk
    header's hash and `data_hashes` the data's; `dctx` is a zstandard decompressor. `out`
    (a writable buffer): decode the record into it and return it, or None when the record
    is not exactly `len(out)` bytes (then `out` may hold anything).
    """
    n = len(logical)
    if n <= CHUNK_HEADER_SIZE + 2:
        return None
    header_hash, data_size, data_hash, type_count, decoded = _HEADER.unpack_from(logical)
    if type_count != ONE_SIMPLE or CHUNK_HEADER_SIZE + data_size != n or decoded > budget or \
            (out is not None and len(out) != decoded) or \
            (hashes and highwayhash64(logical[8:CHUNK_HEADER_SIZE]) != header_hash):
        return None
    data = logical[CHUNK_HEADER_SIZE:]
    # A zstd chunk of a size seen before: its codec byte, sizes block and the values
    # block's size prefix are the bytes checked then (`ZSTD_HEADS`).
    head = ZSTD_HEADS.get(decoded)
    if head is None or data[: len(head)] != head:
        head = ONE_RECORD_HEADS.get(decoded)  # codec byte and sizes block
        if head is None or data[: len(head)] != head:
            head = one_record_head(data, decoded)  # checks the sizes block (raises if odd)
        if head[0] == NONE:
            if not len(head) < data_size == len(head) + decoded or \
                    (data_hashes and highwayhash64(data) != data_hash):
                return None
            if out is not None:
                out[:] = data[len(head) :]
                return out
            return bytes(data[len(head) :])
        head = _zstd_head(data, head, decoded)
        if head is None:
            return None
    if data_hashes and highwayhash64(data) != data_hash:
        return None
    stream = data[len(head) :]
    if decoded > _ZSTD_RATIO * len(stream) + 64:
        return None
    declared = _frame_content_size(stream)
    if declared == decoded:  # libzstd fails a frame that decodes to more or less
        record = dctx.decompress(stream)
    elif declared == -1:  # no content size: exactly `decoded` allocated, never written past
        record = dctx.decompress(stream, max_output_size=decoded)
    else:
        return None
    if len(record) != decoded:
        return None
    # Into `out`: copied from the one-shot decode while it is still in the cache. A
    # streaming decode straight into `out` was no faster, and cannot tell a frame that
    # ends too soon (its checksum cut off, say) from one that ends where it should.
    if out is not None:
        out[:] = memoryview(record)
        return out
    return record


def read_chunks(fds: list[int], file: list[int], start: list[int], end: list[int],
                within: list[int], counts: list[int] | None, budget: int, hashes: bool,
                data_hashes: bool, dctx, into, most: int) -> list | None:
    """Record `within[k]` of each one-record chunk at `[start[k], end[k])` of
    `fds[file[k]]`, read and decoded by the native loop (`_onerecords.c`) with the checks
    `one_record` makes (and the block headers' own): its bytes, None (decoded into
    `into[k]`), or False where the loop did not take it (anything `one_record` might not
    take, or a chunk over `most` bytes). None: no native loop in this build."""
    if _read_chunks is None:
        return None
    return _read_chunks(fds, file, start, end, within, counts, budget, hashes, data_hashes,
                        ZSTD_HEADS, dctx.decompress, _ZSTD_RATIO, most, into)


ZSTD_HEADS: dict[int, bytes] = {}
"""Record size -> the start of a one-record zstd chunk's data up to its values block's
stream (codec byte, sizes block, the values block's size prefix), checked once: a
group_size 1 file repeats a few record sizes, each encoded the same way."""


def _zstd_head(data, head: bytes, size: int) -> bytes | None:
    """`head` (a one-record chunk's checked codec byte and sizes block) and the values
    block's size prefix, when the codec is zstd and the prefix says `size` (not 0);
    remembered in `ZSTD_HEADS`. None otherwise."""
    pos = len(head)
    if head[0] != ZSTD or pos >= len(data):
        return None
    got, end = read_varint(data, pos)
    if got != size or not size:
        return None
    full = head + bytes(data[pos:end])
    if len(ZSTD_HEADS) < _HEADS:
        ZSTD_HEADS[size] = full
    return full


def headers_in(start: int, n: int) -> int:
    """How many block headers lie in the physical range `[start, start + n)`, all whole and
    followed by data; -1 when the range begins inside one, ends inside or right after one,
    or holds more than `MAX_HEADERS`.

    A chunk whose logical bytes fill such a range exactly ends where the range does (the
    writer puts a block header before a chunk's next byte, never after its last): checking
    that its header's data size accounts for the range's logical bytes is then the whole
    of `chunk_end(start, data_size, 1) == start + n` (tests/arrayrecord/test_onerecord.py).
    """
    first = start % BLOCK_SIZE
    if first <= BLOCK_HEADER_SIZE:  # no chunk begins right after a block header (the
        return -1  # writer moves it a byte on); `chunk_end` counts one more header there
    stop = first + n  # the range's end, from the block start before it
    if stop <= BLOCK_SIZE:
        return 0
    count = (stop - 1) // BLOCK_SIZE  # boundaries strictly inside
    if stop - count * BLOCK_SIZE <= BLOCK_HEADER_SIZE or count > MAX_HEADERS:
        return -1
    return count


def strip_into(raw, start: int, count: int, scratch: bytearray, hashes: bool):
    """The logical bytes of the physical range `raw` (beginning at file offset `start`, with
    `count` whole block headers inside, see `headers_in`), copied into `scratch` (grown as
    needed), as a memoryview of it; None when `hashes` and a block header's hash is wrong."""
    view = memoryview(raw)
    n = len(view)
    size = n - count * BLOCK_HEADER_SIZE
    if len(scratch) < size:
        scratch.extend(bytes(size - len(scratch)))
    out = memoryview(scratch)
    lo = 0  # physical position of the current piece
    at = 0  # where it goes in `out`
    boundary = BLOCK_SIZE - start % BLOCK_SIZE
    for _ in range(count):
        out[at : at + boundary - lo] = view[lo:boundary]
        at += boundary - lo
        if hashes and not header_ok(view[boundary : boundary + BLOCK_HEADER_SIZE]):
            return None
        lo = boundary + BLOCK_HEADER_SIZE
        boundary += BLOCK_SIZE
    out[at:size] = view[lo:n]
    return out[:size]


def read_plan(start: int, n: int, count: int, buf: memoryview, headers: memoryview) -> list:
    """The buffers a `preadv` of the physical range `[start, start + n)` (with `count` whole
    block headers inside) fills so that `buf` receives its logical bytes, contiguous, and
    `headers` the block headers, 24 bytes each."""
    if not count:
        return [buf[:n]]
    plan = []
    lo = at = 0
    boundary = BLOCK_SIZE - start % BLOCK_SIZE
    for k in range(count):
        plan.append(buf[at : at + boundary - lo])
        plan.append(headers[k * BLOCK_HEADER_SIZE : (k + 1) * BLOCK_HEADER_SIZE])
        at += boundary - lo
        lo = boundary + BLOCK_HEADER_SIZE
        boundary += BLOCK_SIZE
    plan.append(buf[at : at + n - lo])
    return plan


def header_ok(header) -> bool:
    """A block header's stored hash matches its 16 other bytes."""
    return highwayhash64(header[8:BLOCK_HEADER_SIZE]) == _U64(header)[0]
