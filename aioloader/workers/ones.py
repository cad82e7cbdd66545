"""One-record chunks of local files (group_size 1, the layout of shuffled training data), read
and decoded in a worker: `read_ones`, the `Decoder`'s path for them.

Each chunk is read into a reused buffer (a `preadv` that puts its block headers aside, or a
pread of its own when small) and decoded there (`onerecord.one_record`) while its bytes are
still in the CPU's cache: no buffer allocated per read, no copy to cut block headers out.
Data hashes (verify="all", the default) of two such chunks are computed in lockstep
(`hash64_pair`): one HighwayHash is a chain of dependent steps that leaves most of a core
idle, two fill it, so large records pay much less for the check. Where the package's C
loop is built (`onerecord.read_chunks`), it does all of that for the whole task first, with
the same checks, and the Python loop here only sees what it left. What the short path does
not take is read again and decoded by `decode_records`, which decodes it or names the error.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any

from ..arrayrecord.chunk import RECORD_COST
from ..arrayrecord.codecs import _zstd_decompressor
from ..arrayrecord.hashing import highwayhash64_pair
from ..arrayrecord.index import decode_records
from ..arrayrecord.layout import BLOCK_HEADER_SIZE, BLOCK_SIZE, CHUNK_HEADER_SIZE
from ..arrayrecord.onerecord import header_ok, headers_in, one_record, read_chunks, read_plan
from ..index.planning import ChunkRefs
from ..io.shortread import short_read_error
from .localfiles import LocalFiles

PREADV = getattr(os, "preadv", None)  # Linux, macOS 11+: else reads take the general path
_PREAD = os.pread
_SMALL = 16 << 10  # smaller one-record chunks are read by a pread of their own
_MAX_READ = 4 << 20  # bigger one-record chunks take the general path (not kept in a buffer)
_DATA_HASH = struct.Struct("<Q").unpack_from  # at byte 16 of a chunk header


def _pieces(heads: memoryview, count: int) -> list[memoryview]:
    """The `count` block headers a `read_plan` put aside in `heads`."""
    return [heads[i : i + BLOCK_HEADER_SIZE]
            for i in range(0, count * BLOCK_HEADER_SIZE, BLOCK_HEADER_SIZE)]


def _hash_agrees(logical: memoryview, h: int) -> bool:
    """Whether `h` is the data hash the chunk header at the start of `logical` stores."""
    return _DATA_HASH(logical, 16)[0] == h


def read_ones(files: LocalFiles, bufs: list[bytearray], heads: memoryview, refs: ChunkRefs,
              verify: str, max_decoded: int, paths: Sequence[str] | None,
              into: Any = None) -> list[Any]:
    """Record `refs.within[i]` of each one-record chunk `refs` lists, from local files.

    `bufs` are two reused buffers (grown here as needed), `heads` room for the block headers
    of one read (`onerecord.MAX_HEADERS`). A task over more files than one reader may hold
    open at once is read in consecutive spans (`LocalFiles.spans`). `into` (a sequence of
    1-d uint8 arrays, one a record): record i is decoded into `into[i]` where it is exactly
    that size, and None stands for it in the list; a record decoded another way is its bytes.
    """
    cuts = files.spans(refs)
    if len(cuts) > 1:
        return [r for lo, hi in cuts for r in read_ones(
            files, bufs, heads, refs.take(lo, hi), verify, max_decoded,
            None if paths is None else paths[lo:hi], None if into is None else into[lo:hi])]
    fds = files.hold(refs.paths)
    try:
        return _read_held(files, fds, bufs, heads, refs, verify, max_decoded, paths, into)
    finally:
        files.let_go(refs.paths, fds)


def _read_held(files: LocalFiles, fds: list[int], bufs: list[bytearray], heads: memoryview,
               refs: ChunkRefs, verify: str, max_decoded: int,
               paths: Sequence[str] | None, into: Any) -> list[Any]:
    """`read_ones` with the files' descriptors held (`fds[f]`): the chunks by the native
    loop (`onerecord.read_chunks`), what it leaves (and everything, without it) here."""
    hashes, data_hashes = verify != "none", verify == "all"
    budget = max_decoded - RECORD_COST
    dctx = _zstd_decompressor()
    counts = refs.count.tolist() if refs.count is not None else None
    starts, ends, within = refs.start.tolist(), refs.end.tolist(), refs.within.tolist()
    file = refs.file.tolist()
    out: list[Any] | None = read_chunks(fds, file, starts, ends, within, counts, budget,
                                        hashes, data_hashes, dctx, into, _MAX_READ)
    todo: Sequence[int]
    if out is None:
        out, todo = [None] * len(starts), range(len(starts))
    else:  # what it left
        todo = [k for k, r in enumerate(out) if r is False] if False in out else []
    head = heads[:BLOCK_HEADER_SIZE]  # where the one block header of a crossing goes
    slot = 0  # which of `bufs` the next read goes to
    pending: tuple[int, memoryview] | None = None  # read, its data hash not yet computed

    def general(k: int) -> bytes:
        """Record k read again and decoded by the general path (or its error)."""
        s, e = starts[k], ends[k]
        f = file[k]
        raw = _PREAD(fds[f], e - s, s)
        if len(raw) != e - s:
            raise short_read_error(refs.name(f), s, e, len(raw))
        return decode_records(
            [raw], [s], [within[k]], verify=verify,
            paths=None if paths is None else [paths[k]], chunks=[int(refs.chunk[k])],
            counts=None if counts is None else [counts[k]], max_decoded=max_decoded)[0]

    def decoded(k: int, logical: memoryview, checked: bool) -> bytes | None:
        """Record k from its chunk's logical bytes (None: decoded into its row); `checked`:
        its data hash agreed."""
        try:
            record = one_record(logical, budget, hashes, data_hashes and not checked, dctx,
                                None if into is None else into[k])
        except Exception:  # anything odd: the general path decodes it or says why
            record = None
        if record is None:
            return general(k)
        return None if into is not None else record

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            k, logical = pending
            pending = None
            out[k] = decoded(k, logical, False)

    for k in todo:
        f, s, e, j = file[k], starts[k], ends[k], within[k]
        n = e - s
        crossed = headers_in(s, n) if j == 0 and n <= _MAX_READ and \
            (counts is None or counts[k] == 1) else -1
        if crossed == 0 and n <= _SMALL:  # a read of its own costs less than the views
            raw = _PREAD(fds[f], n, s)
            if len(raw) != n:
                raise short_read_error(refs.name(f), s, e, len(raw))
            out[k] = decoded(k, memoryview(raw), False)
            continue
        if crossed < 0:
            out[k] = general(k)
            continue
        if len(bufs[slot]) < n:
            bufs[slot] = bytearray(max(n, 2 * len(bufs[slot])))
        buf = memoryview(bufs[slot])
        if crossed == 1:  # a ~64 KiB record: the common crossing, without a loop
            cut = BLOCK_SIZE - s % BLOCK_SIZE
            plan: Any = (buf[:cut], head, buf[cut : n - BLOCK_HEADER_SIZE])
        else:
            plan = read_plan(s, n, crossed, buf, heads) if crossed else (buf[:n],)
        got = PREADV(fds[f], plan, s)  # type: ignore[misc]  # set where used
        if got != n:
            raise short_read_error(refs.name(f), s, e, got)
        if hashes and crossed and not (header_ok(head) if crossed == 1 else
                                       all(map(header_ok, _pieces(heads, crossed)))):
            out[k] = general(k)
            continue
        logical = buf[: n - crossed * BLOCK_HEADER_SIZE]
        if not data_hashes or len(logical) <= CHUNK_HEADER_SIZE:
            out[k] = decoded(k, logical, False)
            continue
        slot ^= 1
        if pending is None:
            pending = (k, logical)
            continue
        first, first_logical = pending
        pending = None
        h0, h1 = highwayhash64_pair(first_logical[CHUNK_HEADER_SIZE:],
                                    logical[CHUNK_HEADER_SIZE:])
        out[first] = (decoded(first, first_logical, True) if _hash_agrees(first_logical, h0)
                      else general(first))
        out[k] = decoded(k, logical, True) if _hash_agrees(logical, h1) else general(k)
    flush()
    files.reads += len(out)
    files.bytes += sum(ends) - sum(starts)
    return out

