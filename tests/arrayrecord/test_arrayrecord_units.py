"""Property tests of the format layer's pure pieces: varints, layout, options, chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from aioloader.arrayrecord import ArrayRecordFormatError, ChunkRecords, parse_options, varint
from aioloader.arrayrecord.chunk import decode_simple, encode_simple
from aioloader.arrayrecord.codecs import BROTLI, NONE, SNAPPY, ZSTD, Compression, decompress_block
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
    physical_pieces,
    strip_block_headers,
)
from aioloader.arrayrecord.varint import decode_varints, encode_varint, encode_varints, read_varint

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


@settings(max_examples=300)
@given(st.one_of(st.lists(u64, max_size=40).map(lambda vs: b"".join(map(encode_varint, vs))),
                 st.binary(max_size=60)),
       st.integers(1, 45))
def test_varints_small_loop_and_numpy_passes_agree(blob, count):
    """The Python loop for a few bytes and the NumPy passes, on what `decode_varints` hands
    them (more bytes than varints): the same values, or both an error, for any bytes and
    count (whole varints, cut ones, over-long ones, noise)."""
    assume(len(blob) > count)
    arr = np.frombuffer(blob, dtype=np.uint8)
    got = []
    for decode in (varint._decode_small, varint._decode_passes, decode_varints):
        try:
            got.append(decode(arr, count).tolist())
        except ArrayRecordFormatError:
            got.append("error")
    assert got[0] == got[1] == got[2]


@given(st.lists(st.integers(0, (1 << 14) + 5), min_size=1, max_size=80), st.data())
def test_varints_of_two_bytes_each_decode_as_any_others(values, data):
    """Sizes of 128 B to 16 KiB (two bytes each) take one NumPy pass: the same values, or
    the same refusal once a byte is damaged, as the general passes."""
    blob = bytearray(b"".join(map(encode_varint, values)))
    if data.draw(st.booleans()):
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    count = data.draw(st.sampled_from([len(values), max(1, len(blob) // 2)]))
    got = []
    for decode in (varint._decode_passes, decode_varints):
        try:
            got.append(decode(np.frombuffer(bytes(blob), np.uint8), count).tolist())
        except ArrayRecordFormatError:
            got.append("error")
    assert got[0] == got[1]


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


# -- fast paths: each must agree with the general code it short-cuts -----------------------


def _read_varint_reference(buf, pos, end=None):
    """The plain loop `read_varint` used to be; its fast paths must agree with it."""
    if end is None:
        end = len(buf)
    result = shift = 0
    for i in range(pos, min(end, pos + 10)):
        byte = buf[i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, i + 1
        shift += 7
    raise ArrayRecordFormatError("10 bytes" if end - pos >= 10 else "runs past", offset=pos)


@settings(max_examples=300)
@given(st.binary(max_size=14), st.integers(0, 14), st.one_of(st.none(), st.integers(0, 14)))
def test_read_varint_fast_paths_match_the_loop(blob, pos, end):
    if end is not None:
        end = min(end, len(blob))
    try:
        want = _read_varint_reference(blob, pos, end)
    except ArrayRecordFormatError as err:
        with pytest.raises(ArrayRecordFormatError) as info:
            read_varint(blob, pos, end)
        assert (info.value.what.startswith("varint longer")) == ("10 bytes" in err.what)
        assert info.value.offset == err.offset
    else:
        assert read_varint(memoryview(blob), pos, end) == want


@given(st.integers(0, 2**64 - 1))
def test_encode_varint_matches_vectorized(value):
    assert encode_varint(value) == encode_varints([value])


def _one_record_chunk(record: bytes, compression: Compression):
    data, decoded = encode_simple([record], compression)
    return decode_simple(ChunkHeader(len(data), 0, CHUNK_SIMPLE, 1, decoded), data)


@pytest.mark.parametrize("compression", CODEC_PARAMS, ids=lambda c: c.name)
@pytest.mark.parametrize("record", [b"", b"x", bytes(range(256)) * 5])
def test_one_record_chunk_behaves_like_explicit_bounds(record, compression):
    one = _one_record_chunk(record, compression)
    full = ChunkRecords(one.values, np.array([0, len(one.values)], dtype=np.int64))
    assert len(one) == len(full) == 1
    for j in (0, -1, -2):
        assert one.record(j) == full.record(j)
        assert bytes(one.view(j)) == bytes(full.view(j))
    with pytest.raises(IndexError):
        one.record(1)
    assert one.records() == full.records() == [record]
    assert one.bounds.dtype == np.int64 and one.bounds.tolist() == [0, len(record)]
    assert one.record(0) == record  # the fast path again, after .bounds was built
    assert bytes(memoryview(one.values)) == record
    with pytest.raises(AttributeError):
        one.values = b""  # type: ignore[misc]


def test_one_record_zstd_chunk_returns_the_decoded_bytes_without_a_copy():
    one = _one_record_chunk(bytes(range(256)) * 40, Compression(ZSTD, 3))
    assert one.record(0) is one.values.obj
    assert one.records()[0] is one.values.obj
    view = one.view(0)
    view.release()  # releasing a view the caller got must not break the chunk
    assert one.record(0) == bytes(range(256)) * 40


def _zstd_block_without_content_size(raw: bytes, claimed: int | None = None) -> bytes:
    import zstandard

    stream = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    assert zstandard.frame_content_size(stream) == -1
    return encode_varint(len(raw) if claimed is None else claimed) + stream


@pytest.mark.parametrize("size", [0, 1, 1000, 200_000])
def test_zstd_frame_without_content_size_decodes(size):
    raw = bytes(range(256)) * (size // 256) + bytes(size % 256)
    out = decompress_block(ZSTD, _zstd_block_without_content_size(raw), size, size)
    assert bytes(out) == raw


@pytest.mark.parametrize("claimed", [0, 1, 999, 1001])
def test_zstd_frame_without_content_size_that_lies_is_an_error(claimed):
    raw = b"a" * 1000
    block = _zstd_block_without_content_size(raw, claimed)
    with pytest.raises(ArrayRecordFormatError):
        decompress_block(ZSTD, block, claimed, claimed)


def test_zstd_frame_without_content_size_never_allocates_past_the_claim():
    import tracemalloc

    block = _zstd_block_without_content_size(bytes(64 << 20), 100_000)  # decodes to 64 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ArrayRecordFormatError):
            decompress_block(ZSTD, block, 100_000, 100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@settings(max_examples=100)
@given(st.lists(st.integers(0, 20_000), max_size=100), st.sampled_from(CODEC_PARAMS))
def test_encode_simple_matches_the_general_layout(lengths, compression):
    records = [bytes([n % 251]) * n for n in lengths]
    sizes_block = compression.compress_block(encode_varints(lengths))
    want = (bytes((compression.codec,)) + encode_varint(len(sizes_block)) + sizes_block
            + compression.compress_block(b"".join(records)))
    assert encode_simple(records, compression) == (want, sum(lengths))


@settings(max_examples=200)
@given(
    begin=st.one_of(st.just(64), st.integers(0, 3 * BLOCK_SIZE)),
    data_size=st.one_of(st.integers(0, 300), st.integers(60_000, 200_000)),
    num_records=st.integers(0, 100_000),
    cut=st.integers(0, 200_000),
)
def test_physical_pieces_join_to_physical_chunk(begin, data_size, num_records, cut):
    if 0 < begin % BLOCK_SIZE <= BLOCK_HEADER_SIZE:
        begin += BLOCK_HEADER_SIZE  # not a position a chunk can start at
    data = bytes(range(256)) * (data_size // 256) + bytes(data_size % 256)
    logical = encode_chunk(CHUNK_SIMPLE, data, num_records, 0)
    cut = min(cut, len(logical))
    whole = physical_chunk(begin, logical, num_records)
    assert b"".join(physical_pieces(begin, (logical[:cut], logical[cut:]), num_records)) == whole
    assert b"".join(physical_pieces(begin, (logical,), num_records)) == whole


def test_chunk_header_is_an_immutable_record():
    h = ChunkHeader(1, 2, CHUNK_SIMPLE, 4, 5)
    assert ChunkHeader.parse(h.pack()) == h
    assert (h.data_size, h.data_hash, h.chunk_type, h.num_records, h.decoded_data_size) == (
        1, 2, CHUNK_SIMPLE, 4, 5)
    with pytest.raises(AttributeError):
        h.data_size = 3  # type: ignore[misc]


def test_with_bounds_keeps_every_field_but_the_offsets():
    """`FileIndex.with_bounds` copies fields without the dataclass's `__init__`: a field it
    forgot (a format's per-file context) would vanish from every index of a record table."""
    import dataclasses

    import numpy as np

    from aioloader.arrayrecord.fileindex import FileIndex

    idx = FileIndex("f", 100, 90, np.array([0, 40], dtype=np.int64), np.array([2, 3]),
                    np.array([10, 20], dtype=np.uint32), "opts", None, b"ctx")
    bounds = np.array([0, 40, 90], dtype=np.int64)
    out = idx.with_bounds(bounds)
    for f in dataclasses.fields(FileIndex):
        got, want = getattr(out, f.name), getattr(idx, f.name)
        assert np.array_equal(got, want) if isinstance(want, np.ndarray) else got == want, f.name
    assert out.context == b"ctx" and out.num_records == 5
