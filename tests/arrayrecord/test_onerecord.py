"""The short path for one-record chunks (`arrayrecord.onerecord`) and the workers' reads of
them (`workers.ones.read_ones`): the same records as the general path, or none at all (the
general path then decides), whatever the chunk's place across block boundaries."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aioloader.arrayrecord import ArrayRecordFormatError, onerecord
from aioloader.arrayrecord.chunk import DEFAULT_MAX_DECODED, RECORD_COST
from aioloader.arrayrecord.index import decode_chunk, read_index
from aioloader.arrayrecord.layout import (
    BLOCK_HEADER_SIZE,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    chunk_end,
    strip_block_headers,
)
from aioloader.arrayrecord.onerecord import (
    MAX_HEADERS,
    header_ok,
    headers_in,
    one_record,
    read_plan,
    strip_into,
)
from aioloader.index.planning import ChunkRefs
from aioloader.workers.decode import Decoder

from ..support.arrayrecord_util import write_theirs

starts = st.integers(0, 4 * BLOCK_SIZE)
lengths = st.integers(CHUNK_HEADER_SIZE + 3, 3 * BLOCK_SIZE)


@settings(max_examples=2000, deadline=None)
@given(starts, lengths)
def test_a_range_taken_holds_exactly_the_chunk_that_fills_it(start, n):
    """Where `headers_in` takes a range, a one-record chunk of its logical size ends exactly
    at the range's end (what `_check_fills` would check), and vice versa."""
    count = headers_in(start, n)
    if count >= 0:
        logical = n - count * BLOCK_HEADER_SIZE
        assert chunk_end(start, logical - CHUNK_HEADER_SIZE, 1) == start + n
        assert len(strip_block_headers(bytes(n), start, verify=False)) == logical
    elif start % BLOCK_SIZE > BLOCK_HEADER_SIZE:
        stop = start % BLOCK_SIZE + n
        inside = (stop - 1) // BLOCK_SIZE
        assert inside > MAX_HEADERS or stop - inside * BLOCK_SIZE <= BLOCK_HEADER_SIZE


@settings(max_examples=300, deadline=None)
@given(st.integers(CHUNK_HEADER_SIZE, 4 * BLOCK_SIZE), st.integers(3, 70 * BLOCK_SIZE))
def test_every_chunks_own_range_is_taken(start, data_size):
    """A one-record chunk's own range (no padding after it) is one the short path takes,
    unless it crosses more than `MAX_HEADERS` block boundaries."""
    if start % BLOCK_SIZE <= BLOCK_HEADER_SIZE:  # the writer never begins a chunk there
        return
    stop = chunk_end(start, data_size, 1)
    count = headers_in(start, stop - start)
    if count < 0:
        assert (start % BLOCK_SIZE + stop - start - 1) // BLOCK_SIZE > MAX_HEADERS
    else:
        assert stop - start - count * BLOCK_HEADER_SIZE == CHUNK_HEADER_SIZE + data_size


def _physical(start: int, n: int, seed: int) -> bytes:
    """`n` random bytes that stand for the range at `start`, with valid block headers."""
    rng = random.Random(seed)
    raw = bytearray(rng.randbytes(n))
    from aioloader.arrayrecord.layout import block_header

    boundary = start - start % BLOCK_SIZE + BLOCK_SIZE
    while boundary + BLOCK_HEADER_SIZE <= start + n:
        raw[boundary - start : boundary - start + BLOCK_HEADER_SIZE] = block_header(
            boundary, start, start + n)
        boundary += BLOCK_SIZE
    return bytes(raw)


@settings(max_examples=300, deadline=None)
@given(starts, lengths, st.integers(0, 99))
def test_strip_into_and_read_plan_give_the_logical_bytes(tmp_path_factory, start, n, seed):
    count = headers_in(start, n)
    if count < 0:
        return
    raw = _physical(start, n, seed)
    want = bytes(strip_block_headers(raw, start, verify=True))
    scratch = bytearray(3)
    assert bytes(strip_into(raw, start, count, scratch, True)) == want
    path = tmp_path_factory.mktemp("plan") / "f"
    path.write_bytes(bytes(start) + raw)
    buf, heads = memoryview(bytearray(n)), memoryview(bytearray(MAX_HEADERS * 24))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.preadv(fd, read_plan(start, n, count, buf, heads), start) == n
    finally:
        os.close(fd)
    assert bytes(buf[: len(want)]) == want
    assert all(header_ok(heads[i * 24 : i * 24 + 24]) for i in range(count))


def test_strip_into_refuses_a_damaged_block_header():
    start, n = BLOCK_SIZE - 100, 300
    raw = bytearray(_physical(start, n, 1))
    raw[100 + 9] ^= 1
    assert strip_into(bytes(raw), start, 1, bytearray(), True) is None
    assert strip_into(bytes(raw), start, 1, bytearray(), False) is not None


def _chunks(tmp_path, records, options):
    path = tmp_path / "f.ar"
    write_theirs(path, records, options)
    data = path.read_bytes()
    ix = read_index(len(data), lambda o, n: data[o : o + n], path=str(path))
    return path, data, ix


@pytest.mark.parametrize("options", ["group_size:1,zstd:3", "group_size:1,uncompressed",
                                     "group_size:1,snappy"])
def test_one_record_is_the_general_paths_record_or_none(tmp_path, options):
    rng = random.Random(7)
    records = [rng.randbytes(rng.choice([1, 100, 5000, 70_000, 140_000])) for _ in range(30)]
    records += [b"ab" * 40_000]  # compressible: a frame with a content size, or without
    _path, data, ix = _chunks(tmp_path, records, options)
    dctx = zstandard.ZstdDecompressor()
    taken = 0
    for c in range(len(ix.chunk_offsets)):
        s, e = (int(x) for x in ix.chunk_range(c))
        want = decode_chunk(data[s:e], s, whole_range=True)[1].record(0)
        count = headers_in(s, e - s)
        if count < 0:
            continue
        logical = strip_into(data[s:e], s, count, bytearray(), True)
        for hashes, data_hashes in ((True, True), (True, False), (False, False)):
            got = one_record(logical, DEFAULT_MAX_DECODED - RECORD_COST, hashes, data_hashes,
                             dctx)
            assert got is None or got == want
            taken += got is not None
            # decoded into a buffer: the same record, or None; never into one of another size
            for size in (len(want), len(want) + 1, max(0, len(want) - 1)):
                out = np.full(size, 7, np.uint8)
                into = one_record(logical, DEFAULT_MAX_DECODED - RECORD_COST, hashes,
                                  data_hashes, dctx, out)
                assert into is None or (into is out and size == len(want)
                                        and out.tobytes() == want)
                assert into is None or got is not None  # (frames without a size: None)
    if "snappy" not in options:
        assert taken >= 3 * 25  # the short path takes nearly all of them


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 70_000), st.integers(0, 255), st.sampled_from([0, 1, 2]))
@example(64, 0, 0)  # a bit of the values frame's header: a streaming decode took it
def test_a_damaged_chunk_gives_the_general_paths_record_or_none(tmp_path_factory, at, xor, lvl):
    """Whatever one byte of a chunk becomes, the short path returns the record the general
    path returns for those bytes, or nothing: never a record the general path refuses."""
    tmp = tmp_path_factory.mktemp("dmg")
    rng = random.Random(at)
    cache = _CASES.setdefault("f", None)
    if cache is None:
        recs = [rng.randbytes(60_000), b"xy" * 20_000]
        cache = _CASES["f"] = _chunks(tmp, recs, "group_size:1,zstd:3")
    _, data, ix = cache
    verify = ("none", "headers", "all")[lvl]
    dctx = zstandard.ZstdDecompressor()
    for c in range(len(ix.chunk_offsets)):
        s, e = (int(x) for x in ix.chunk_range(c))
        raw = bytearray(data[s:e])
        raw[at % len(raw)] ^= xor or 1
        raw = bytes(raw)
        try:
            want = decode_chunk(raw, s, verify=verify, whole_range=True,
                                expected_records=1)[1].record(0)
        except ArrayRecordFormatError:
            want = None
        count = headers_in(s, e - s)
        if count < 0:
            continue
        logical = strip_into(raw, s, count, bytearray(), verify != "none")
        try:
            got = None if logical is None else one_record(
                logical, DEFAULT_MAX_DECODED - RECORD_COST, verify != "none",
                verify == "all", dctx)
        except Exception:
            got = None  # the callers fall back on anything raised
        assert got is None or got == want
        out = np.empty(len(want) if want is not None else 60_000, np.uint8)
        try:  # decoded into a buffer (the typed rows' path): the same, or nothing
            into = None if logical is None else one_record(
                logical, DEFAULT_MAX_DECODED - RECORD_COST, verify != "none",
                verify == "all", dctx, out)
        except Exception:
            into = None
        assert into is None or (into is out and out.tobytes() == want)


_CASES: dict = {}


def _refs(path, ix, order) -> ChunkRefs:
    starts = ix.chunk_offsets[order]
    ends = ix.chunk_ends[order]
    n = len(order)
    return ChunkRefs(paths=[str(path)], file=np.zeros(n, np.int64), chunk=np.asarray(order),
                     start=starts, end=ends, within=np.zeros(n, np.int64),
                     count=ix.chunk_records[order])


@pytest.fixture(params=["C loop", "Python loop"])
def loop(request, monkeypatch):
    """The workers' reads with the C loop (`onerecord.read_chunks`), or as a build without
    it reads: the Python loop alone."""
    if request.param == "Python loop":
        monkeypatch.setattr(onerecord, "_read_chunks", None)
    return request.param


@pytest.mark.parametrize("verify", ["none", "headers", "all"])
def test_decoder_reads_equal_the_records_in_any_order(tmp_path, verify, loop):
    rng = random.Random(3)
    records = [rng.randbytes(rng.choice([0, 3, 1000, 65_000, 65_600, 200_000, 5_000_000]))
               for _ in range(25)]
    path, _, ix = _chunks(tmp_path, records, "group_size:1,zstd:3")
    order = list(range(len(records)))
    rng.shuffle(order)
    dec = Decoder()
    try:
        got = dec.records(_refs(path, ix, np.asarray(order)), None, verify=verify)
        assert got == [records[i] for i in order]
        assert dec.files.reads == len(records)
    finally:
        dec.close()


def test_decoder_reads_of_a_damaged_chunk_name_the_file(tmp_path, loop):
    records = [bytes([i]) * 70_000 for i in range(3)]
    path, _data, ix = _chunks(tmp_path, records, "group_size:1,uncompressed")
    s = int(ix.chunk_offsets[1])
    with open(path, "r+b") as f:  # a byte of the record's data
        f.seek(s + CHUNK_HEADER_SIZE + 500)
        f.write(b"\xff")
    dec = Decoder()
    try:
        refs = _refs(path, ix, np.arange(3))
        with pytest.raises(ArrayRecordFormatError, match=r"f\.ar.*data hash"):
            dec.records(refs, None, verify="all", paths=[str(path)] * 3)
        got = dec.records(refs, None, verify="headers")  # data hashes not checked
        assert got[0] == records[0] and got[2] == records[2] and got[1] != records[1]
    finally:
        dec.close()


def test_decoder_reads_in_pairs_refuse_each_damaged_chunk(tmp_path, loop):
    """Large chunks' data hashes are computed two at a time (`hash64_pair`); small ones,
    read alone, break the pairs up. With the default verify, a flipped byte in any one chunk
    (first or second of a pair, or the last, alone) is an error naming that chunk, and the
    records before it are the right ones."""
    rng = random.Random(5)
    sizes = [70_000, 70_000, 30, 66_000, 20_000, 30, 30, 90_000, 70_000, 65_600, 40_000]
    records = [rng.randbytes(n) for n in sizes]
    path, data, ix = _chunks(tmp_path, records, "group_size:1,zstd:3")
    order = np.arange(len(records))
    dec = Decoder()
    try:
        assert dec.records(_refs(path, ix, order), None) == records
        for c in range(len(records)):
            s = int(ix.chunk_offsets[c])
            damaged = bytearray(data)
            damaged[s + CHUNK_HEADER_SIZE + 30] ^= 0x10  # inside the chunk's data
            bad = tmp_path / f"bad{c}.ar"
            bad.write_bytes(bytes(damaged))
            with pytest.raises(ArrayRecordFormatError, match=rf"bad{c}\.ar, chunk {c},.*data hash"):
                dec.records(_refs(bad, ix, order), None, paths=[str(bad)] * len(records))
            assert dec.records(_refs(bad, ix, order[:c]), None) == records[:c]
    finally:
        dec.close()


def test_decoder_reads_of_a_shrunk_file_fail(tmp_path, loop):
    records = [bytes([i]) * 70_000 for i in range(3)]
    path, _data, ix = _chunks(tmp_path, records, "group_size:1,uncompressed")
    dec = Decoder()
    try:
        refs = _refs(path, ix, np.arange(3))
        dec.files.let_go([str(path)], dec.files.hold([str(path)]))  # opened before it shrinks
        os.truncate(path, int(ix.chunk_offsets[2]) + 1000)
        with pytest.raises(Exception, match="shorter than when it was opened"):
            dec.records(refs, None)
    finally:
        dec.close()
