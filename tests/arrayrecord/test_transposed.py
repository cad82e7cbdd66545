"""Transposed chunks ('t'): files array_record writes with `transpose:true` read back equal.

array_record is the oracle: its writer makes the files (protocol buffer records, hand-encoded
in wire format, plus records that are not protos), its reader says what they hold.
"""

from __future__ import annotations

import asyncio
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.arrayrecord import ArrayRecordFormatError, decode_chunk
from aioloader.arrayrecord.hashing import highwayhash64
from aioloader.arrayrecord.layout import CHUNK_HEADER_SIZE, ChunkHeader, _parse_chunk_header
from aioloader.arrayrecord.transposed import decode_transposed
from aioloader.arrayrecord.varint import encode_varint, read_varint

from ..support.arrayrecord_util import read_theirs, write_theirs

CODECS = ["uncompressed", "zstd", "brotli", "snappy"]


# -- hand-encoded protobuf wire format ---------------------------------------------------------


def key(field: int, wire: int) -> bytes:
    return encode_varint(field << 3 | wire)


def varint_field(field: int, value: int) -> bytes:
    return key(field, 0) + encode_varint(value)


def bytes_field(field: int, value: bytes) -> bytes:
    return key(field, 2) + encode_varint(len(value)) + value


def fixed32(field: int, value: int) -> bytes:
    return key(field, 5) + struct.pack("<I", value)


def fixed64(field: int, value: int) -> bytes:
    return key(field, 1) + struct.pack("<Q", value)


def group(field: int, body: bytes) -> bytes:
    return key(field, 3) + body + key(field, 4)


def shape_records(shape: str, count: int, seed: int = 0) -> list[bytes]:
    """`count` records of one shape: flat, nested, repeated, wide tags, mixed with non-protos."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if shape == "flat":  # id, name, score: the common feature-row shape
            r = (varint_field(1, i) + bytes_field(2, f"name-{i}".encode())
                 + fixed32(3, rng.getrandbits(32)) + fixed64(4, rng.getrandbits(64)))
        elif shape == "varints":  # inline (< 128), 1..10-byte buffered, negative int64
            r = b"".join(varint_field(f, v) for f, v in
                         [(1, rng.randrange(128)), (2, rng.getrandbits(rng.randint(1, 64))),
                          (3, 2**64 - 1 - rng.randrange(5)), (4, 0)])
        elif shape == "nested":  # submessages three deep, some empty
            inner = varint_field(1, i) + bytes_field(2, rng.randbytes(rng.randrange(40)))
            mid = bytes_field(1, inner) + bytes_field(2, b"") + fixed32(3, i)
            r = bytes_field(5, mid) + bytes_field(6, bytes_field(7, mid)) + varint_field(8, 1)
        elif shape == "repeated":  # repeated scalars, strings and messages, packed varints
            packed = b"".join(encode_varint(rng.getrandbits(20)) for _ in range(rng.randrange(9)))
            r = (b"".join(varint_field(1, rng.randrange(300)) for _ in range(rng.randrange(6)))
                 + b"".join(bytes_field(2, rng.randbytes(rng.randrange(9)))
                            for _ in range(rng.randrange(4)))
                 + b"".join(bytes_field(3, varint_field(1, k)) for k in range(rng.randrange(4)))
                 + bytes_field(4, packed))
        elif shape == "wide":  # 1- to 5-byte tags, groups, large strings crossing blocks
            r = (varint_field(2**29 - 1, i) + bytes_field(100_000, rng.randbytes(3000))
                 + group(17, varint_field(1, i) + fixed64(2, i)) + varint_field(16, 5))
        elif shape == "mixed":  # protos, non-protos and empty records interleaved
            r = rng.choice([varint_field(1, i), b"", b"\xff not a proto",
                            bytes_field(1, b"\x08"), b"\x1a\x03\x08\x01\x10\x02",
                            rng.randbytes(rng.randrange(50))])
        else:
            raise ValueError(shape)
        out.append(r)
    return out


SHAPES = ["flat", "varints", "nested", "repeated", "wide", "mixed"]


def read_via_source(path) -> list[bytes]:
    with al.ArrayRecordSource(str(path)) as src:
        by_index = [src[i] for i in range(len(src))]
        assert list(src) == by_index
        return by_index


def read_via_dataset(path) -> list[bytes]:
    async def run():
        async with al.Dataset.from_arrayrecord(str(path)).loader(workers=1) as it:
            return [bytes(r) async for r in it]

    return asyncio.run(run())


# -- equal to array_record's reader --------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("group_size", [1, 64])
@pytest.mark.parametrize("shape", SHAPES)
def test_reads_what_array_record_reads(tmp_path, codec, group_size, shape):
    records = shape_records(shape, 150 if shape != "wide" else 40, seed=group_size)
    path = tmp_path / "t.ar"
    write_theirs(path, records, f"group_size:{group_size},transpose:true,{codec}")
    theirs = read_theirs(path)
    assert theirs == records
    assert read_via_source(path) == theirs


@pytest.mark.parametrize("group_size", [1, 64])
def test_dataset_loader_reads_transposed_files(tmp_path, group_size):
    records = shape_records("mixed", 200) + shape_records("nested", 100)
    path = tmp_path / "t.ar"
    write_theirs(path, records, f"group_size:{group_size},transpose:true,zstd")
    assert read_via_dataset(path) == read_theirs(path)


def test_bucket_size_option_splits_buffers_into_many_buckets(tmp_path):
    records = shape_records("flat", 500) + shape_records("repeated", 300)
    path = tmp_path / "t.ar"
    write_theirs(path, records, "group_size:1000,transpose:true,transpose_bucket_size:64,brotli")
    assert read_via_source(path) == read_theirs(path) == records


# -- damaged and crafted chunks --------------------------------------------------------------


def first_chunk(path) -> tuple[ChunkHeader, bytes]:
    raw = path.read_bytes()
    header = _parse_chunk_header(ChunkHeader, memoryview(raw)[64:], True, None, 64)
    data = raw[64 + CHUNK_HEADER_SIZE : 64 + CHUNK_HEADER_SIZE + header.data_size]
    return header, data


@pytest.fixture
def uncompressed_chunk(tmp_path):
    """A one-block uncompressed transposed file: (path, chunk header, chunk data)."""
    path = tmp_path / "t.ar"
    write_theirs(path, shape_records("mixed", 30) + shape_records("flat", 30),
                 "group_size:64,transpose:true,uncompressed")
    return (path, *first_chunk(path))


def rehash(path, data: bytes, **changes) -> None:
    """Replace the first chunk's data (same length) and fields, with every hash made right."""
    raw = bytearray(path.read_bytes())
    old = _parse_chunk_header(ChunkHeader, memoryview(raw)[64:], True, None, 64)
    assert len(data) == old.data_size
    fields = old._asdict() | {"data_hash": highwayhash64(data)} | changes
    raw[64 : 64 + CHUNK_HEADER_SIZE] = ChunkHeader(**fields).pack()
    raw[64 + CHUNK_HEADER_SIZE : 64 + CHUNK_HEADER_SIZE + len(data)] = data
    path.write_bytes(bytes(raw))


def test_every_truncation_is_a_format_error(uncompressed_chunk):
    _, header, data = uncompressed_chunk
    for cut in range(len(data)):
        with pytest.raises(ArrayRecordFormatError, match="transposed chunk"):
            decode_transposed(header, data[:cut], 1 << 20)


def test_every_single_byte_change_is_an_error_or_decodes_in_bounds(uncompressed_chunk):
    _, header, data = uncompressed_chunk
    for i in range(len(data)):
        for delta in (1, 0x40, 0x7F, 0xFF):
            bad = bytearray(data)
            bad[i] = (bad[i] + delta) & 0xFF
            try:
                got = decode_transposed(header, bytes(bad), 1 << 20)
            except ArrayRecordFormatError:
                continue
            assert len(got) == header.num_records  # a change the hash would catch
            assert sum(len(r) for r in got.records()) == header.decoded_data_size


def test_crafted_buffer_length_with_valid_hashes_is_a_clear_error(uncompressed_chunk):
    path, _, data = uncompressed_chunk
    assert data[0] == 0  # uncompressed: the header's bytes are in the clear
    # Header: codec, header length, bucket count, buffer count, then the bucket lengths and
    # the buffer lengths; make the first buffer claim one byte more than its bucket holds.
    _, pos = read_varint(data, 1)
    num_buckets, pos = read_varint(data, pos)
    _, pos = read_varint(data, pos)
    for _ in range(num_buckets):
        _, pos = read_varint(data, pos)
    assert data[pos] < 0x7F
    bad = bytearray(data)
    bad[pos] += 1
    rehash(path, bytes(bad))
    with pytest.raises(ArrayRecordFormatError, match=r"buffer 0 .* runs past") as info:
        read_via_source(path)
    assert "t.ar" in str(info.value) and "chunk 0" in str(info.value)


def test_crafted_decoded_size_with_valid_hashes_is_a_clear_error(uncompressed_chunk):
    path, header, data = uncompressed_chunk
    rehash(path, data, decoded_data_size=header.decoded_data_size - 1)
    with pytest.raises(ArrayRecordFormatError, match=r"exceed the .* bytes the header"):
        read_via_source(path)
    rehash(path, data, decoded_data_size=header.decoded_data_size + 1)
    with pytest.raises(ArrayRecordFormatError, match="records fill"):
        read_via_source(path)


def test_declared_sizes_are_checked_against_the_budget_before_allocating(uncompressed_chunk):
    _, header, data = uncompressed_chunk
    huge = header._replace(decoded_data_size=1 << 40)
    with pytest.raises(ArrayRecordFormatError, match="memory budget"):
        decode_transposed(huge, data, 1 << 30)
    # A zstd header block claiming a gigabyte is refused before it is decompressed.
    bomb = bytes([0x7A]) + encode_varint(6) + encode_varint(1 << 30) + b"\x28\xb5\x2f\xfd\x00"
    with pytest.raises(ArrayRecordFormatError, match="header"):
        decode_transposed(header, bomb, 1 << 20)


def test_an_implicit_loop_is_refused():
    # One bucket-less header: 0 buckets, 0 buffers, 2 nodes (no-ops) each implicitly leading
    # to the other, first node 0.
    h = bytes([0, 0, 2, 0, 0, 2 + 1, 2 + 0, 0])
    data = bytes([0]) + encode_varint(len(h)) + h
    header = ChunkHeader(len(data), highwayhash64(data), 0x74, 1, 0)
    with pytest.raises(ArrayRecordFormatError, match="loop of implicit"):
        decode_transposed(header, data, 1 << 20)


def test_a_walk_longer_than_its_data_is_stopped():
    # Two no-op nodes, node 0 implicitly to 1, node 1 back to 0 through a byte; 200k bytes
    # of transitions that each repeat three times drive a walk that writes nothing.
    h = bytes([0, 0, 2, 0, 0, 2 + 1, 0, 0])
    data = bytes([0]) + encode_varint(len(h)) + h + bytes([3]) * 200_000
    header = ChunkHeader(len(data), highwayhash64(data), 0x74, 0, 0)
    with pytest.raises(ArrayRecordFormatError, match="walks longer"):
        decode_transposed(header, data, 1 << 30)


# -- property: random proto-ish records round-trip through array_record's writer -----------


def messages(depth: int = 2) -> st.SearchStrategy[bytes]:
    field_no = st.sampled_from([1, 2, 3, 15, 16, 300, 2**21, 2**29 - 1])
    scalar = st.one_of(
        st.builds(varint_field, field_no, st.integers(0, 2**64 - 1)),
        st.builds(varint_field, field_no, st.integers(0, 200)),
        st.builds(fixed32, field_no, st.integers(0, 2**32 - 1)),
        st.builds(fixed64, field_no, st.integers(0, 2**64 - 1)),
        st.builds(bytes_field, field_no, st.binary(max_size=40)),
    )
    if depth == 0:
        return st.lists(scalar, max_size=5).map(b"".join)
    inner = messages(depth - 1)
    field = st.one_of(scalar, st.builds(bytes_field, field_no, inner),
                      st.builds(group, field_no, inner))
    return st.lists(field, max_size=6).map(b"".join)


RECORDS = st.lists(st.one_of(messages(), st.binary(max_size=60)), min_size=1, max_size=80)
OPTIONS = st.sampled_from([f"group_size:{g},transpose:true,{c}"
                           for g in (1, 3, 64) for c in CODECS])


def _roundtrip(tmp_path_factory, records, options):
    path = tmp_path_factory.mktemp("p") / "t.ar"
    write_theirs(path, records, options)
    raw = path.read_bytes()
    assert read_theirs(path) == records
    ours, pos = [], 64
    while len(ours) < len(records):
        header, chunk = decode_chunk(raw[pos:], pos, verify="all")
        assert header.chunk_type == 0x74
        ours += chunk.records()
        pos = int(_next_chunk(pos, header))
    assert ours == records


def _next_chunk(pos: int, header: ChunkHeader) -> int:
    from aioloader.arrayrecord.layout import chunk_end

    return chunk_end(pos, header.data_size, header.num_records)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=RECORDS, options=OPTIONS)
def test_random_protoish_records_round_trip(tmp_path_factory, records, options):
    _roundtrip(tmp_path_factory, records, options)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=RECORDS, options=OPTIONS)
def test_random_protoish_records_round_trip_long(tmp_path_factory, records, options):
    _roundtrip(tmp_path_factory, records, options)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40))
def test_random_byte_changes_never_escape_as_other_errors(seed, n):
    rng = random.Random(seed)
    records = shape_records(rng.choice(SHAPES), 20, seed)
    header, data = _cached_chunk(tuple(records[:n]))
    bad = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        bad[rng.randrange(len(bad))] = rng.randrange(256)
    try:
        got = decode_transposed(header, bytes(bad), 1 << 24)
    except ArrayRecordFormatError:
        return
    assert sum(len(r) for r in got.records()) == header.decoded_data_size


_CHUNKS: dict = {}


def _cached_chunk(records: tuple) -> tuple[ChunkHeader, bytes]:
    import pathlib
    import tempfile

    if records not in _CHUNKS:
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "t.ar"
            write_theirs(path, list(records), "group_size:64,transpose:true,uncompressed")
            _CHUNKS[records] = first_chunk(path)
    return _CHUNKS[records]
