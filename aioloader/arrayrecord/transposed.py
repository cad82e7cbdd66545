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
from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .layout import ChunkHeader
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
_MASKS = [0] + [int.from_bytes(b"\x80" * (k - 1) + b"\x00", "little") for k in range(1, 11)]


def _fail(what: str) -> ArrayRecordFormatError:
    return ArrayRecordFormatError(f"transposed chunk: {what}", hint=CORRUPT_HINT)


class _Header:
    """A cursor over the decompressed header, reading varints with named failures."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def varint(self, what: str, bits: int = 64) -> int:
        try:
            value, end = read_varint(self.buf, self.pos)
        except ArrayRecordFormatError:
            raise _fail(f"header ends or breaks inside the {what}") from None
        if bits == 32 and (value >> 32 or end - self.pos > 5):
            raise _fail(f"{what} {value} does not fit 32 bits")
        self.pos = end
        return value

    def count(self, what: str, min_bytes: int = 1) -> int:
        """A count of items that each take at least `min_bytes` of the rest of the header."""
        n = self.varint(what, 32)
        if n * min_bytes > len(self.buf) - self.pos:
            raise _fail(f"{what} {n} is more than the {len(self.buf) - self.pos} header "
                        "bytes left can describe")
        return n


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
        raise _fail(f"data of {len(data)} bytes is shorter than its codec byte and header")
    codec = data[0]
    if codec not in CODEC_NAMES:
        raise _fail(f"unknown compression type 0x{codec:02x}")
    try:
        header_len, pos = read_varint(data, 1)
    except ArrayRecordFormatError:
        raise _fail("the header length is truncated") from None
    if header_len > len(data) - pos:
        raise _fail(f"header of {header_len} bytes runs past the chunk data "
                    f"({len(data) - pos} bytes left)")
    h = _Header(bytes(_block(codec, data[pos : pos + header_len], budget, "header")))
    pos += header_len

    num_buckets = h.count("bucket count")
    num_buffers = h.count("buffer count")
    if num_buckets == 0 and num_buffers:
        raise _fail(f"{num_buffers} buffers but no buckets")
    bucket_lens = [h.varint("bucket length") for _ in range(num_buckets)]
    buffer_lens = [h.varint("buffer length") for _ in range(num_buffers)]
    # Every buffer byte ends up in a record, except the varint32 lengths of non-proto ones.
    if sum(buffer_lens) > size + 5 * n:
        raise _fail(f"buffers declare {sum(buffer_lens)} bytes, more than {n} records of "
                    f"{size} bytes can hold")
    nodes = _parse_nodes(h, num_buffers, budget)
    first = h.varint("first node", 32)
    if first >= len(nodes[0]):
        raise _fail(f"first node {first} is not one of the {len(nodes[0])} nodes")
    if h.pos != len(h.buf):
        raise _fail(f"{len(h.buf) - h.pos} stray bytes after the header")

    buckets = []
    for i, length in enumerate(bucket_lens):
        if length > len(data) - pos:
            raise _fail(f"bucket {i} of {length} bytes runs past the chunk data "
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
        raise _fail(f"{what}: {err.what}") from None
    budget[0] -= len(out)
    return out


def _split(buckets: list, lengths: list) -> list:
    """Cut the decompressed buckets into buffers; a buffer never straddles two buckets."""
    buffers = []
    b, off = 0, 0
    for i, length in enumerate(lengths):
        bucket = buckets[b]
        if off + length > len(bucket):
            raise _fail(f"buffer {i} of {length} bytes runs past the end of bucket {b}")
        buffers.append(bytes(bucket[off : off + length]))
        off += length
        while off == len(buckets[b]) and b + 1 < len(buckets):
            b, off = b + 1, 0
    if buckets and (b + 1 < len(buckets) or off != len(buckets[b])):
        raise _fail(f"bucket {b} holds bytes that no buffer claims")
    return buffers


def _parse_nodes(h: _Header, num_buffers: int, budget: list) -> tuple:
    """The state machine as parallel lists: kind, tag bytes, buffer, length, next, implicit."""
    count = h.count("node count", 2)  # a tag and a next index each
    budget[0] -= NODE_COST * count
    if budget[0] < 0:
        raise _fail(f"{count} state machine nodes exceed the memory budget")
    tags = [h.varint("node tag", 32) for _ in range(count)]
    nexts = [h.varint("next node", 32) for _ in range(count)]
    n_sub = sum(1 for t in tags if t >= 8 and t & 7 == 0)
    if n_sub > len(h.buf) - h.pos:
        raise _fail("header ends inside the subtypes")
    subtypes = h.buf[h.pos : h.pos + n_sub]
    h.pos += n_sub
    kinds, tag_bytes, bufs, args = [], [], [], []
    has_nonproto, s = False, 0
    for i, tag in enumerate(tags):
        kind, data, buf, arg = K_NOOP, b"", -1, 0
        if tag == _NOOP:
            pass
        elif tag == _NONPROTO:
            kind, buf, has_nonproto = K_NONPROTO, _buffer_index(h, num_buffers), True
        elif tag == _START_OF_MESSAGE:
            kind = K_MESSAGE
        elif tag == _START_OF_SUBMESSAGE:
            kind = K_SUB_START
        else:
            wire = tag & 7
            end_of_sub = wire == _SUBMESSAGE_WIRE_TYPE
            if end_of_sub:
                tag, wire = tag - _SUBMESSAGE_WIRE_TYPE + 2, 2
            if tag < 8 or wire > 5:
                raise _fail(f"node {i} has invalid tag {tag}")
            data = encode_varint(tag)
            if wire == 0:
                sub = subtypes[s]
                s += 1
                if sub > _INLINE_MAX:
                    raise _fail(f"node {i} has invalid varint subtype {sub}")
                if sub >= _INLINE0:
                    kind, data = K_COPY, data + bytes((sub - _INLINE0,))
                else:
                    kind, arg = K_VARINT, sub + 1
            elif wire in (1, 5):
                kind, arg = K_FIXED, 8 if wire == 1 else 4
            elif wire == 2:
                kind = K_SUB_END if end_of_sub else K_STRING
            else:  # start or end of a group: the tag alone
                kind = K_COPY
            if kind in (K_VARINT, K_FIXED, K_STRING):
                buf = _buffer_index(h, num_buffers)
        kinds.append(kind)
        tag_bytes.append(data)
        bufs.append(buf)
        args.append(arg)
    if has_nonproto and not num_buffers:
        raise _fail("a non-proto node but no buffer for non-proto record lengths")
    implicit = [nx >= count for nx in nexts]
    nexts = [nx - count if nx >= count else nx for nx in nexts]
    for i, nx in enumerate(nexts):
        if nx >= count:
            raise _fail(f"node {i} leads to node {nx}, beyond the {count} nodes")
    _check_no_implicit_loop(nexts, implicit)
    return kinds, tag_bytes, bufs, args, nexts, implicit


def _buffer_index(h: _Header, num_buffers: int) -> int:
    b = h.varint("buffer index", 32)
    if b >= num_buffers:
        raise _fail(f"buffer index {b} beyond the {num_buffers} buffers")
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
                raise _fail(f"nodes {i}..{j} form a loop of implicit transitions")
            if seen[j]:
                break
            seen[j] = mark


def _run(nodes: tuple, first: int, buffers: list, transitions: bytes, n: int,
         size: int) -> tuple[bytearray, np.ndarray]:
    """Replay the walk, writing records backwards into a buffer of exactly `size` bytes.

    Pieces are gathered last to first and copied into place in batches (one slice
    assignment costs as much as ten appends); `cur` tracks where the next piece ends.
    """
    kinds, tag_bytes, bufs, args, nexts, implicit = nodes
    count = len(kinds)
    out = bytearray(size)
    cur = size  # bytes of `out` not yet written, from the front
    done = size  # where the pieces gathered since the last flush end
    pieces: list = []
    put = pieces.append
    bpos = [0] * len(buffers)
    nonproto_lengths = len(buffers) - 1
    starts: list[int] = []  # `cur` at each record's start, last record first
    stack: list = []  # (cur at a submessage's end, its tag bytes)
    masks = _MASKS
    t, t_end = 0, len(transitions)
    # Legitimate walks visit about 4 nodes per transition byte plus one per written byte or
    # record at most; a crafted one driving empty nodes in a loop stops here.
    steps_left = 4 * (t_end + 1) + 2 * size + 2 * n + 2 * count + 64
    node = first
    iters = 1 if implicit[node] else 0
    while True:
        kind = kinds[node]
        if kind == K_STRING:
            b = bufs[node]
            buf, p = buffers[b], bpos[b]
            length, q = _varint32(buf, p, "string length")
            q += length
            if q > len(buf):
                raise _fail(f"string of {length} bytes runs past its buffer {b}")
            tag = tag_bytes[node]
            k = len(tag) + q - p
            if k > cur:
                raise _fail(f"records exceed the {size} bytes the header declares")
            cur -= k
            put(buf[p:q])
            put(tag)
            bpos[b] = q
        elif kind in (K_VARINT, K_FIXED):
            b = bufs[node]
            buf, p, k = buffers[b], bpos[b], args[node]
            if p + k > len(buf):
                raise _fail(f"a field runs past the end of its buffer {b}")
            tag = tag_bytes[node]
            m = len(tag) + k
            if m > cur:
                raise _fail(f"records exceed the {size} bytes the header declares")
            cur -= m
            if kind == K_VARINT:
                put((int.from_bytes(buf[p : p + k], "little") | masks[k]).to_bytes(k, "little"))
            else:
                put(buf[p : p + k])
            put(tag)
            bpos[b] = p + k
        elif kind == K_COPY:
            tag = tag_bytes[node]
            if len(tag) > cur:
                raise _fail(f"records exceed the {size} bytes the header declares")
            cur -= len(tag)
            put(tag)
        elif kind == K_MESSAGE:
            if stack:
                raise _fail("a record starts while a submessage is still open")
            if len(starts) == n:
                raise _fail(f"more records than the {n} the header declares")
            starts.append(cur)
        elif kind == K_SUB_END:
            stack.append((cur, tag_bytes[node]))
        elif kind == K_SUB_START:
            if not stack:
                raise _fail("a submessage starts that was never ended")
            end, tag = stack.pop()
            head = tag + encode_varint(end - cur)
            if end - cur >> 32:
                raise _fail("a submessage longer than 4 GiB")
            if len(head) > cur:
                raise _fail(f"records exceed the {size} bytes the header declares")
            cur -= len(head)
            put(head)
        elif kind == K_NONPROTO:
            lens, lp = buffers[nonproto_lengths], bpos[nonproto_lengths]
            length, bpos[nonproto_lengths] = _varint32(lens, lp, "non-proto record length")
            b = bufs[node]
            buf, p = buffers[b], bpos[b]
            if p + length > len(buf):
                raise _fail(f"non-proto record of {length} bytes runs past its buffer {b}")
            if length > cur:
                raise _fail(f"records exceed the {size} bytes the header declares")
            cur -= length
            put(buf[p : p + length])
            bpos[b] = p + length
            if stack:
                raise _fail("a record starts while a submessage is still open")
            if len(starts) == n:
                raise _fail(f"more records than the {n} the header declares")
            starts.append(cur)
        steps_left -= 1
        if steps_left < 0:
            raise _fail("the state machine walks longer than its data can drive")
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
                raise _fail(f"a transition leads to node {node}, beyond the {count} nodes")
            iters = (byte & 3) + (1 if implicit[node] else 0)
        elif not implicit[node]:
            iters -= 1
    _flush(out, cur, done, pieces)
    if stack:
        raise _fail(f"{len(stack)} submessages still open at the end")
    if len(starts) != n:
        raise _fail(f"{len(starts)} records decoded, the header declares {n}")
    if cur != 0 or (starts and starts[-1] != 0):
        raise _fail(f"records fill {size - cur} of the {size} bytes the header declares"
                    if cur else "bytes before the first record belong to no record")
    bounds = np.empty(n + 1, dtype=np.int64)
    bounds[:n] = starts[::-1]
    bounds[n] = size
    return out, bounds


def _flush(out: bytearray, cur: int, done: int, pieces: list) -> None:
    """Copy the pieces gathered last to first into `out[cur:done]`."""
    joined = b"".join(pieces[::-1])
    if len(joined) != done - cur:  # would resize `out`; cannot happen if the sums are right
        raise _fail("internal: pieces do not add up to the bytes written")
    out[cur:done] = joined
    pieces.clear()


def _varint32(buf, pos: int, what: str) -> tuple[int, int]:
    try:
        value, end = read_varint(buf, pos)
    except ArrayRecordFormatError:
        raise _fail(f"a {what} is truncated") from None
    if value >> 32 or end - pos > 5:
        raise _fail(f"a {what} does not fit 32 bits")
    return value, end
