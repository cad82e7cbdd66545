"""Property tests of the format layer's pure pieces: varints, layout, options, chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.arrayrecord import ArrayRecordFormatError, parse_options
from aioloader.arrayrecord.chunk import decode_simple, encode_simple
from aioloader.arrayrecord.codecs import BROTLI, NONE, SNAPPY, ZSTD, Compression
from aioloader.arrayrecord.layout import (
    BLOCK_HEADER_SIZE,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    CHUNK_SIMPLE,
    ChunkHeader,
    chunk_end,
    encode_chunk,
    padding_chunk,
    physical_chunk,
    strip_block_headers,
)
from aioloader.arrayrecord.varint import decode_varints, encode_varint, read_varint

u64 = st.integers(min_value=0, max_value=2**64 - 1)


@given(st.lists(u64, max_size=200))
def test_varints_roundtrip_scalar_and_vectorized(values):
    blob = b"".join(encode_varint(v) for v in values)
    assert decode_varints(blob, len(values)).tolist() == values
    pos, out = 0, []
    while pos < len(blob):
        v, pos = read_varint(blob, pos)
        out.append(v)
    assert out == values


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=50), st.integers(1, 3))
def test_varints_wrong_count_or_truncation_is_an_error(values, cut):
    blob = b"".join(encode_varint(v) for v in values)
    with pytest.raises(ArrayRecordFormatError):
        decode_varints(blob, len(values) + 1)
    if values[-1] >= 128:
        with pytest.raises(ArrayRecordFormatError):
            decode_varints(blob[:-1], len(values))
    if len(values) > cut:
        with pytest.raises(ArrayRecordFormatError):
            decode_varints(blob, len(values) - cut)


def test_eleven_byte_varint_is_rejected():
    with pytest.raises(ArrayRecordFormatError, match="10 bytes"):
        read_varint(b"\xff" * 11, 0)
    with pytest.raises(ArrayRecordFormatError, match="10 bytes"):
        decode_varints(b"\xff" * 10 + b"\x01", 1)


@settings(max_examples=300)
@given(
    begin_block=st.integers(0, 3),
    begin_off=st.one_of(st.just(0), st.integers(25, BLOCK_SIZE - 1)),
    data_size=st.one_of(st.integers(0, 300), st.integers(60_000, 200_000)),
    num_records=st.integers(0, 100_000),
)
def test_physical_layout_strips_back_to_logical(begin_block, begin_off, data_size, num_records):
    """Laying a chunk out and stripping block headers gives back the logical bytes,
    and the chunk ends where `chunk_end` says, on a valid boundary."""
    begin = begin_block * BLOCK_SIZE + begin_off
    if begin == 0:
        begin = 64
    data = bytes(range(256)) * (data_size // 256) + bytes(data_size % 256)
    logical = encode_chunk(CHUNK_SIMPLE, data, num_records, 0)
    raw = physical_chunk(begin, logical, num_records)
    end = chunk_end(begin, data_size, num_records)
    assert len(raw) == end - begin
    assert end % BLOCK_SIZE == 0 or end % BLOCK_SIZE > BLOCK_HEADER_SIZE
    stripped = bytes(strip_block_headers(raw, begin))
    assert stripped[: len(logical)] == logical
    assert set(stripped[len(logical) :]) <= {0}
    header = ChunkHeader.parse(stripped)
    assert (header.data_size, header.num_records) == (data_size, num_records)


@given(st.integers(64, 5 * BLOCK_SIZE))
def test_padding_ends_on_a_boundary(pos):
    if 0 < pos % BLOCK_SIZE <= BLOCK_HEADER_SIZE:
        return  # not a position a chunk can start at
    pad = padding_chunk(pos)
    assert (pos + len(pad)) % BLOCK_SIZE == 0
    assert len(pad) < BLOCK_SIZE + CHUNK_HEADER_SIZE


def test_strip_is_zero_copy_inside_a_block():
    buf = bytearray(1000)
    out = strip_block_headers(buf, 100)
    assert isinstance(out, memoryview) and out.obj is buf


CODEC_PARAMS = [Compression(NONE, None), Compression(ZSTD, 3), Compression(BROTLI, 5),
                Compression(SNAPPY, None)]


@settings(max_examples=60)
@given(st.lists(st.binary(max_size=300), max_size=40), st.sampled_from(CODEC_PARAMS))
def test_simple_chunk_roundtrip(records, compression):
    data, decoded = encode_simple(records, compression)
    header = ChunkHeader(len(data), 0, CHUNK_SIMPLE, len(records), decoded)
    out = decode_simple(header, data)
    assert out.records() == records
    assert out.bounds.dtype == np.int64


def test_header_hash_is_checked():
    raw = bytearray(encode_chunk(CHUNK_SIMPLE, b"\x00\x01\x00", 0, 0))
    ChunkHeader.parse(raw)
    raw[12] ^= 1
    with pytest.raises(ArrayRecordFormatError, match="header hash"):
        ChunkHeader.parse(raw, path="f.ar", offset=64)
    ChunkHeader.parse(raw, verify=False)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", "group_size:1,transpose:false,pad_to_block_boundary:false,zstd:3,window_log:20,"
             "max_parallelism:1"),
        ("default", "group_size:1,transpose:false,pad_to_block_boundary:false,zstd:3,"
                    "window_log:20"),
        ("group_size:5,brotli", "group_size:5,transpose:false,pad_to_block_boundary:false,"
                                "brotli:6"),
        ("snappy:2,pad_to_block_boundary", "group_size:1,transpose:false,"
                                           "pad_to_block_boundary:true,snappy"),
    ],
)
def test_options_canonical_form(text, canonical):
    opts = parse_options(text)
    if text == "":
        from dataclasses import replace

        opts = replace(opts, max_parallelism=1)
    assert opts.to_string() == canonical


@pytest.mark.parametrize(
    "bad",
    ["group_size:0", "zstd,brotli", "snappy,window_log:20", "zstd:23", "brotli:12",
     "zstd,window_log:32", "brotli,window_log:31", "frobnicate", "uncompressed:3",
     "group_size:x", "transpose:maybe"],
)
def test_bad_options_raise_valueerror(bad):
    with pytest.raises(ValueError):
        parse_options(bad)
