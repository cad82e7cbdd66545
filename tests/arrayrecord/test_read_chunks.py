"""The native loop over one-record chunks (`onerecord.read_chunks`, `_onerecords.c`): each
chunk it takes gives the record `one_record` gives for the same bytes (block headers cut out
as `workers.ones` cuts them), and a chunk `one_record` (or the general path) refuses is never
taken. Chunks are read from real files, written by array_record itself or built here around
frames of every kind zstd allows."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.arrayrecord.chunk import DEFAULT_MAX_DECODED, RECORD_COST
from aioloader.arrayrecord.codecs import _zstd_decompressor
from aioloader.arrayrecord.hashing import highwayhash64
from aioloader.arrayrecord.index import decode_chunk, read_index
from aioloader.arrayrecord.layout import BLOCK_HEADER_SIZE, BLOCK_SIZE, CHUNK_HEADER_SIZE
from aioloader.arrayrecord.onerecord import (
    ZSTD_HEADS,
    _read_chunks,
    headers_in,
    one_record,
    read_chunks,
    strip_into,
)

from ..support.arrayrecord_util import write_theirs

pytestmark = pytest.mark.skipif(_read_chunks is None, reason="built without the C loop")

BUDGET = DEFAULT_MAX_DECODED - RECORD_COST
MOST = 4 << 20


def _file(tmp_path, records: list[bytes], options: str = "group_size:1,zstd:3"):
    path = tmp_path / "f.ar"
    write_theirs(path, records, options)
    data = path.read_bytes()
    ix = read_index(len(data), lambda o, n: data[o : o + n], path=str(path))
    return path, data, [tuple(int(x) for x in ix.chunk_range(c))
                        for c in range(len(ix.chunk_offsets))]


def _learned(tmp_path, records: list[bytes], options: str = "group_size:1,zstd:3"):
    """`_file`, each chunk then read once by `one_record`, which learns the heads of its
    sizes (as a worker's first reads do)."""
    path, data, ranges = _file(tmp_path, records, options)
    for s, e in ranges:
        _python(data, s, e)
    return path, data, ranges


def _loop(path, ranges, *, hashes=True, data_hashes=True, budget=BUDGET, into=None,
          within=None, counts=None, most=MOST):
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_chunks([fd], [0] * len(ranges), [s for s, _ in ranges],
                          [e for _, e in ranges], within or [0] * len(ranges), counts, budget,
                          hashes, data_hashes, _zstd_decompressor(), into, most)
    finally:
        os.close(fd)


def _python(data: bytes, s: int, e: int, hashes=True, data_hashes=True, budget=BUDGET,
            out=None):
    """What `workers.ones` takes of the chunk at `[s, e)` by `one_record`, or None."""
    count = headers_in(s, e - s)
    if count < 0:
        return None
    try:
        logical = strip_into(data[s:e], s, count, bytearray(), hashes)
        return None if logical is None else one_record(
            logical, budget, hashes, data_hashes, _zstd_decompressor(), out)
    except Exception:
        return None


@pytest.mark.parametrize("options", ["group_size:1,zstd:3", "group_size:1,uncompressed"])
def test_each_chunk_taken_is_one_records_record(tmp_path, options):
    rng = random.Random(5)
    records = [rng.randbytes(rng.choice([1, 2, 100, 1000, 5000, 16_000, 65_000, 140_000]))
               for _ in range(40)]
    records += [b"ab" * 3000, b"x" * 300, b"hello world " * 50, b"cd" * 100_000]
    path, data, ranges = _learned(tmp_path, records, options)
    for hashes, data_hashes in ((True, True), (True, False), (False, False)):
        got = _loop(path, ranges, hashes=hashes, data_hashes=data_hashes)
        assert len(got) == len(ranges)
        for (s, e), r in zip(ranges, got):
            if r is not False:
                assert r == _python(data, s, e, hashes, data_hashes) is not None
        readable = [k for k, (s, e) in enumerate(ranges) if headers_in(s, e - s) >= 0]
        assert len(readable) > 35
        if "zstd" in options:  # the loop takes every zstd chunk the short path reads
            assert all(got[k] is not False for k in readable)
        else:  # uncompressed chunks are left to Python
            assert all(r is False for r in got)


def test_rows_are_filled_only_when_of_the_records_size(tmp_path):
    rng = random.Random(6)
    records = [rng.randbytes(600) for _ in range(20)]
    path, _, ranges = _learned(tmp_path, records)
    for size, taken in ((600, True), (599, False), (601, False)):
        rows = np.full((len(ranges), size), 7, np.uint8)
        got = _loop(path, ranges, into=rows)
        for k, r in enumerate(got):
            if taken and headers_in(ranges[k][0], ranges[k][1] - ranges[k][0]) >= 0:
                assert r is None and rows[k].tobytes() == records[k]
            else:
                assert r is False
                assert (rows[k] == 7).all()
    # a row of the record's bytes but not of its length (`len(out)`, as Python checks it)
    flat = np.full((len(ranges), 2, 300), 7, np.uint8)
    assert _loop(path, ranges, into=flat) == [False] * len(ranges)


def test_what_the_loop_never_takes(tmp_path):
    records = [bytes([k]) * 700 for k in range(10)]
    path, _, ranges = _learned(tmp_path, records)
    assert all(r is not False for r in _loop(path, ranges))
    assert all(r is False for r in _loop(path, ranges, within=[1] * 10))  # not record 0
    assert all(r is False for r in _loop(path, ranges, most=ranges[0][1] - ranges[0][0] - 1))
    assert all(r is False for r in _loop(path, ranges, counts=[2] * 10))  # a larger chunk
    assert all(r is False for r in _loop(path, ranges, budget=699))  # over the budget
    assert all(r is False for r in _loop(path, ranges, budget=-1))
    assert [r is False for r in _loop(path, ranges, counts=[1] * 10)] == [False] * 10
    assert all(r is not False for r in _loop(path, ranges, budget=2**70))  # (no overflow)
    assert _loop(path, [(e, s) for s, e in ranges]) == [False] * 10  # ends before it starts
    shifted = [(s - 1, e) for s, e in ranges]  # a range that is not the chunk's
    assert all(r is False for r in _loop(path, shifted))
    with open(path, "r+b") as f:  # a file cut short: no short read taken for a record
        f.truncate(ranges[5][0] + 10)
    got = _loop(path, ranges)
    assert all(r is False for r in got[5:]) and all(r is not False for r in got[:5])


def test_arguments_of_the_wrong_kind_raise(tmp_path):
    path, _, ranges = _file(tmp_path, [b"a" * 100])
    fd = os.open(path, os.O_RDONLY)
    d = _zstd_decompressor()
    try:
        with pytest.raises(IndexError):
            read_chunks([fd], [3], [ranges[0][0]], [ranges[0][1]], [0], None, BUDGET, True,
                       True, d, None, MOST)
        with pytest.raises(ValueError):
            read_chunks([fd], [0, 0], [ranges[0][0]], [ranges[0][1]], [0], None, BUDGET,
                       True, True, d, None, MOST)
        with pytest.raises(TypeError):
            read_chunks([fd], (0,), [ranges[0][0]], [ranges[0][1]], [0], None, BUDGET, True,
                       True, d, None, MOST)
    finally:
        os.close(fd)


# -- frames of every kind, in chunks built here ---------------------------------------------

_HEADER = struct.Struct("<QQQQQ")


def _head(tmp_path, size: int) -> bytes:
    """The head (codec byte, sizes block, values size prefix) of a zstd one-record chunk of
    `size` bytes, as array_record writes it, and as `one_record` learns it."""
    _, data, ranges = _file(tmp_path, [bytes(size)])
    s, e = ranges[0]
    assert _python(data, s, e) == bytes(size)
    return ZSTD_HEADS[size]


def _chunk(head: bytes, stream: bytes, size: int) -> bytes:
    data = head + stream
    rest = struct.pack("<QQQ", len(data), highwayhash64(data), 0x72 | 1 << 8) + \
        struct.pack("<Q", size)
    return struct.pack("<Q", highwayhash64(rest)) + rest + data


def _frames(record: bytes) -> dict[str, bytes]:
    one = zstandard.ZstdCompressor(level=3).compress(record)
    bare = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(record)
    half = len(record) // 2
    return {
        "sized": one,
        "unsized": bare,
        "checksummed": zstandard.ZstdCompressor(write_checksum=True).compress(record),
        "two unsized frames": zstandard.ZstdCompressor(write_content_size=False).compress(
            record[:half]) + zstandard.ZstdCompressor(write_content_size=False).compress(
            record[half:]),
        "two sized frames": zstandard.ZstdCompressor().compress(record[:half]) +
        zstandard.ZstdCompressor().compress(record[half:]),
        "cut short": one[:-3],
        "with a tail": one + b"\0\0\0",
        "a dictionary id": zstandard.ZstdCompressor(
            dict_data=zstandard.ZstdCompressionDict(b"dictionary" * 20,
                                                    dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        ).compress(record),
        "skippable": struct.pack("<II", 0x184D2A50, 4) + b"abcd" + one,
        "reserved bit": one[:4] + bytes([one[4] | 0x08]) + one[5:],
    }


@pytest.mark.parametrize("size", [1, 200, 255, 256, 257, 5000, 65_791, 65_792])
def test_every_kind_of_frame_is_decoded_as_one_record_decodes_it(tmp_path, size):
    """Each frame declaring its size in 1, 2 or 4 bytes, or not at all, with a checksum,
    a dictionary, two frames, a cut or a tail: the loop's answer is `one_record`'s."""
    (tmp_path / "h").mkdir()
    head = _head(tmp_path / "h", size)
    rng = random.Random(size)
    record = bytes(rng.randrange(4) for _ in range(size))
    path = tmp_path / "built"
    for name, stream in _frames(record).items():
        chunk = _chunk(head, stream, size)
        at = 1000  # within the first block, after its header
        path.write_bytes(bytes(at) + chunk)
        raw = path.read_bytes()
        want = _python(raw, at, at + len(chunk))
        assert at + len(chunk) <= BLOCK_SIZE
        got = _loop(path, [(at, at + len(chunk))])[0]
        assert got is False or (want is not None and got == want), name
        if name in ("sized", "unsized", "checksummed"):
            assert got == record, name  # the plain frames are taken


_CASE: dict = {}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 140_000), st.integers(0, 255), st.sampled_from([0, 1, 2]))
@example(CHUNK_HEADER_SIZE + 5, 0, 2)
@example(BLOCK_SIZE + 3, 0, 1)  # in the block header a 64 KiB record crosses
def test_a_damaged_chunk_gives_the_general_paths_record_or_is_left(tmp_path_factory, at, xor,
                                                                   lvl):
    """Whatever one byte of a chunk (or a block header it crosses) becomes, the loop
    returns the record the general path returns for those bytes, or leaves the chunk: never
    a record it refuses."""
    if "f" not in _CASE:
        tmp = tmp_path_factory.mktemp("small")
        rng = random.Random(1)
        _CASE["f"] = _file(tmp, [rng.randbytes(3000), b"xy" * 2000, rng.randbytes(100),
                                 rng.randbytes(70_000), b"z" * 140_000])
    _, data, ranges = _CASE["f"]
    verify = ("none", "headers", "all")[lvl]
    tmp = tmp_path_factory.mktemp("dmg")
    for s, e in ranges:
        _python(data, s, e)
        raw = bytearray(data)
        raw[s + at % (e - s)] ^= xor or 1
        damaged = tmp / "d.ar"
        damaged.write_bytes(bytes(raw))
        try:
            want = decode_chunk(bytes(raw[s:e]), s, verify=verify, whole_range=True,
                                expected_records=1)[1].record(0)
        except ArrayRecordFormatError:
            want = None
        # all the chunks in one call: each checked alone, or paired with another's hash
        got = _loop(damaged, ranges, hashes=verify != "none", data_hashes=verify == "all")
        k = ranges.index((s, e))
        assert got[k] is False or (want is not None and got[k] == want)


def test_a_damaged_block_header_is_left_unless_headers_go_unchecked(tmp_path):
    rng = random.Random(2)
    records = [rng.randbytes(70_000) for _ in range(3)]
    path, data, ranges = _learned(tmp_path, records)
    crossing = [k for k, (s, e) in enumerate(ranges) if headers_in(s, e - s) > 0]
    assert crossing and all(r is not False for r in _loop(path, ranges))
    k = crossing[0]
    s = ranges[k][0]
    header = s + BLOCK_SIZE - s % BLOCK_SIZE  # the first block header inside the chunk
    raw = bytearray(data)
    raw[header + BLOCK_HEADER_SIZE - 1] ^= 0x40  # its next-chunk field: its hash disagrees
    path.write_bytes(bytes(raw))
    assert _loop(path, ranges)[k] is False
    assert _loop(path, ranges, hashes=False, data_hashes=False)[k] == records[k]
