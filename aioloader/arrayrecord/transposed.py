"""Transposed chunks ('t'): protocol buffer records stored column-wise, rebuilt by a state machine.

Riegeli's transposed encoding (array_record's `transpose:true`) splits each proto record into
its fields: field values go to per-(field, kind) *buffers*, packed into compressed *buckets*,
and the order of tags is kept as a walk over a small state machine whose steps are stored
one byte each in a *transitions* block. Records that do not parse as protos are stored whole
in a non-proto buffer. Decoding replays the walk; each node writes its field *backwards*
(the encoder walked the records last to first), so the output is filled from its end.

Layout of the chunk data (all counts varints; blocks are codec blocks as in simple chunks):
codec byte, header length, header block, `num_buckets` bucket blocks, transitions block. The
decompressed header holds: num_buckets, num_buffers, the bucket lengths (stored sizes), the
buffer lengths (decoded), the node count N, N tags, N next-node indices (index + N means
"implicit": leave without reading a transition byte), one subtype byte per varint-typed
tag, a buffer index per node that has a buffer (in node order), and the first node.

Full decoding only (no field projection). Every declared size is checked before anything is
allocated: decoded blocks against the memory budget left after the output itself, buffer
lengths against the bytes they can produce, the walk's length against what its data can
drive; anything inconsistent is an `ArrayRecordFormatError` saying what.
"""

from __future__ import annotations

import numpy as np

from .chunk import RECORD_COST, ChunkRecords, check_budget
from .codecs import CODEC_NAMES, decompress_block
from .errors import ArrayRecordFormatError
from .layout import ChunkHeader
from .statemachine import (
    K_COPY,
    K_FIXED,
    K_MESSAGE,
    K_NONPROTO,
    K_STRING,
    K_SUB_END,
    K_SUB_START,
    K_VARINT,
    Header,
    fail,
    parse_nodes,
)
from .varint import encode_varint, read_varint

_MASKS = [0] + [int.from_bytes(b"\x80" * (k - 1) + b"\x00", "little") for k in range(1, 11)]


def decode_transposed(header: ChunkHeader, data, max_decoded: int) -> ChunkRecords:
    """Decode the data of a transposed chunk whose header was already parsed.

    `max_decoded` bounds the memory the chunk may take to decode: the output and its index
    arrays, plus every decompressed intermediate block and the state machine.
    """
    n, size = header.num_records, header.decoded_data_size
    check_budget(n, size, max_decoded)
    budget = [max_decoded - size - RECORD_COST * n]
    data = memoryview(data)
    if len(data) < 2:
        raise fail(f"data of {len(data)} bytes is shorter than its codec byte and header")
    codec = data[0]
    if codec not in CODEC_NAMES:
        raise fail(f"unknown compression type 0x{codec:02x}")
    try:
        header_len, pos = read_varint(data, 1)
    except ArrayRecordFormatError:
        raise fail("the header length is truncated") from None
    if header_len > len(data) - pos:
        raise fail(f"header of {header_len} bytes runs past the chunk data "
                    f"({len(data) - pos} bytes left)")
    h = Header(bytes(_block(codec, data[pos : pos + header_len], budget, "header")))
    pos += header_len

    num_buckets = h.count("bucket count")
    num_buffers = h.count("buffer count")
    if num_buckets == 0 and num_buffers:
        raise fail(f"{num_buffers} buffers but no buckets")
    bucket_lens = [h.varint("bucket length") for _ in range(num_buckets)]
    buffer_lens = [h.varint("buffer length") for _ in range(num_buffers)]
    # Every buffer byte ends up in a record, except the varint32 lengths of non-proto ones.
    if sum(buffer_lens) > size + 5 * n:
        raise fail(f"buffers declare {sum(buffer_lens)} bytes, more than {n} records of "
                    f"{size} bytes can hold")
    nodes = parse_nodes(h, num_buffers, budget)
    first = h.varint("first node", 32)
    if first >= len(nodes[0]):
        raise fail(f"first node {first} is not one of the {len(nodes[0])} nodes")
    if h.pos != len(h.buf):
        raise fail(f"{len(h.buf) - h.pos} stray bytes after the header")

    buckets = []
    for i, length in enumerate(bucket_lens):
        if length > len(data) - pos:
            raise fail(f"bucket {i} of {length} bytes runs past the chunk data "
                        f"({len(data) - pos} bytes left)")
        buckets.append(_block(codec, data[pos : pos + length], budget, f"bucket {i}"))
        pos += length
    budget[0] -= sum(buffer_lens)  # the buffers are copies: bytes slice faster than views
    buffers = _split(buckets, buffer_lens)
    del buckets
    transitions = bytes(_block(codec, data[pos:], budget, "transitions"))
    out, bounds = _run(nodes, first, buffers, transitions, n, size)
    return ChunkRecords(memoryview(out).toreadonly(), bounds)


def _block(codec: int, block, budget: list, what: str):
    """Decompress one block, its declared size charged to the budget first."""
    try:
        out = decompress_block(codec, block, None, max(budget[0], 0))
    except ArrayRecordFormatError as err:
        raise fail(f"{what}: {err.what}") from None
    budget[0] -= len(out)
    return out


def _split(buckets: list, lengths: list) -> list:
    """Cut the decompressed buckets into buffers; a buffer never straddles two buckets."""
    buffers = []
    b, off = 0, 0
    for i, length in enumerate(lengths):
        bucket = buckets[b]
        if off + length > len(bucket):
            raise fail(f"buffer {i} of {length} bytes runs past the end of bucket {b}")
        buffers.append(bytes(bucket[off : off + length]))
        off += length
        while off == len(buckets[b]) and b + 1 < len(buckets):
            b, off = b + 1, 0
    if buckets and (b + 1 < len(buckets) or off != len(buckets[b])):
        raise fail(f"bucket {b} holds bytes that no buffer claims")
    return buffers


def _run(nodes: tuple, first: int, buffers: list, transitions: bytes, n: int,
         size: int) -> tuple[bytearray, np.ndarray]:
    """Replay the walk into a buffer of exactly `size` bytes; the records' bounds in it."""
    out = bytearray(size)
    starts: list[int] = []  # where each record starts, last record first
    cur, open_subs = _replay(nodes, first, buffers, transitions, n, out, starts)
    if open_subs:
        raise fail(f"{open_subs} submessages still open at the end")
    if len(starts) != n:
        raise fail(f"{len(starts)} records decoded, the header declares {n}")
    if cur != 0 or (starts and starts[-1] != 0):
        raise fail(f"records fill {size - cur} of the {size} bytes the header declares"
                   if cur else "bytes before the first record belong to no record")
    bounds = np.empty(n + 1, dtype=np.int64)
    bounds[:n] = starts[::-1]
    bounds[n] = size
    return out, bounds


def _replay(nodes: tuple, node: int, buffers: list, transitions: bytes, n: int,
            out: bytearray, starts: list[int]) -> tuple[int, int]:
    """Walk the state machine from `node`, each node writing its field *backwards* into
    `out`; the bytes left unwritten at the front, and the submessages left open.

    Pieces are gathered last to first and copied into place in batches (one slice
    assignment costs as much as ten appends); `cur` tracks where the next piece ends, and a
    piece that would pass the front of `out` fails once, after the node wrote it.
    """
    kinds, tag_bytes, bufs, args, nexts, implicit = nodes
    count, size, masks = len(kinds), len(out), _MASKS
    cur = done = size  # bytes not yet written; where the pieces since the last flush end
    pieces: list = []
    put = pieces.append
    bpos = [0] * len(buffers)
    nonproto_lengths = len(buffers) - 1
    stack: list = []  # (cur at a submessage's end, its tag bytes)
    t, t_end = 0, len(transitions)
    # Legitimate walks visit about 4 nodes per transition byte plus one per written byte or
    # record at most; a crafted one driving empty nodes in a loop stops here.
    steps_left = 4 * (t_end + 1) + 2 * size + 2 * n + 2 * count + 64
    iters = 1 if implicit[node] else 0
    while True:
        kind = kinds[node]
        if kind >= K_VARINT:  # a field from its buffer: K_VARINT, K_FIXED, K_STRING
            b = bufs[node]
            buf, p = buffers[b], bpos[b]
            if kind == K_STRING:
                length, q = _varint32(buf, p, "string length")
                q += length
                if q > len(buf):
                    raise fail(f"string of {length} bytes runs past its buffer {b}")
                piece = buf[p:q]
            else:
                k = args[node]
                q = p + k
                if q > len(buf):
                    raise fail(f"a field runs past the end of its buffer {b}")
                piece = buf[p:q] if kind == K_FIXED else \
                    (int.from_bytes(buf[p:q], "little") | masks[k]).to_bytes(k, "little")
            tag = tag_bytes[node]
            cur -= len(tag) + q - p
            put(piece)
            put(tag)
            bpos[b] = q
        elif kind == K_COPY:
            tag = tag_bytes[node]
            cur -= len(tag)
            put(tag)
        elif kind == K_SUB_END:
            stack.append((cur, tag_bytes[node]))
        elif kind == K_SUB_START:
            if not stack:
                raise fail("a submessage starts that was never ended")
            end, tag = stack.pop()
            head = tag + encode_varint(end - cur)
            if end - cur >> 32:
                raise fail("a submessage longer than 4 GiB")
            cur -= len(head)
            put(head)
        elif kind in (K_MESSAGE, K_NONPROTO):
            if kind == K_NONPROTO:  # a whole record, its length in the last buffer
                lens, lp = buffers[nonproto_lengths], bpos[nonproto_lengths]
                length, bpos[nonproto_lengths] = _varint32(lens, lp, "non-proto record length")
                b = bufs[node]
                buf, p = buffers[b], bpos[b]
                if p + length > len(buf):
                    raise fail(f"non-proto record of {length} bytes runs past its buffer {b}")
                if length > cur:
                    raise fail(f"records exceed the {size} bytes the header declares")
                cur -= length
                put(buf[p : p + length])
                bpos[b] = p + length
            if stack:
                raise fail("a record starts while a submessage is still open")
            if len(starts) == n:
                raise fail(f"more records than the {n} the header declares")
            starts.append(cur)
        if cur < 0:
            raise fail(f"records exceed the {size} bytes the header declares")
        steps_left -= 1
        if steps_left < 0:
            raise fail("the state machine walks longer than its data can drive")
        if len(pieces) > 4096:
            _flush(out, cur, done, pieces)
            done = cur
        # Step to the next node: a transition byte is (offset << 2 | repeats), repeats being
        # further steps to `next` with no byte; leaving an implicit node costs no byte.
        node = nexts[node]
        if iters == 0:
            if t == t_end:
                break
            byte = transitions[t]
            t += 1
            node += byte >> 2
            if node >= count:
                raise fail(f"a transition leads to node {node}, beyond the {count} nodes")
            iters = (byte & 3) + (1 if implicit[node] else 0)
        elif not implicit[node]:
            iters -= 1
    _flush(out, cur, done, pieces)
    return cur, len(stack)


def _flush(out: bytearray, cur: int, done: int, pieces: list) -> None:
    """Copy the pieces gathered last to first into `out[cur:done]`."""
    joined = b"".join(pieces[::-1])
    if len(joined) != done - cur:  # would resize `out`; cannot happen if the sums are right
        raise fail("internal: pieces do not add up to the bytes written")
    out[cur:done] = joined
    pieces.clear()


def _varint32(buf, pos: int, what: str) -> tuple[int, int]:
    try:
        value, end = read_varint(buf, pos)
    except ArrayRecordFormatError:
        raise fail(f"a {what} is truncated") from None
    if value >> 32 or end - pos > 5:
        raise fail(f"a {what} does not fit 32 bits")
    return value, end
