"""Compatibility with Google's array_record: their files we read, our files they read."""

from __future__ import annotations

import random

import pytest

import aioloader
from aioloader.arrayrecord import parse_options
from aioloader.arrayrecord.layout import BLOCK_SIZE, CHUNK_HEADER_SIZE

from ..support.arrayrecord_util import (
    CODECS,
    GROUP_SIZES,
    RECORD_SHAPES,
    LocalFile,
    make_records,
    read_all_ours,
    read_theirs,
    write_theirs,
)

pytest.importorskip("array_record")

MATRIX = [
    pytest.param(codec, g, size, count, id=f"{codec}-g{g}-{label}")
    for codec in CODECS
    for g in GROUP_SIZES
    for label, size, count in RECORD_SHAPES
]


@pytest.mark.parametrize(("codec", "group", "size", "count"), MATRIX)
def test_their_writer_our_reader(tmp_path, codec, group, size, count):
    records = make_records(size, count, seed=group)
    path = tmp_path / "theirs.array_record"
    write_theirs(path, records, f"group_size:{group},{codec}")
    f = LocalFile(path)
    try:
        reader = f.reader(verify="all")
        assert len(reader) == len(records)
        assert list(reader) == records
        rng = random.Random(1)
        picks = [rng.randrange(len(records)) for _ in range(50)]
        assert reader.read(picks) == [records[i] for i in picks]
        assert reader.index.group_size == group
        assert reader.index.writer_options.startswith(f"group_size:{group},")
    finally:
        f.close()


@pytest.mark.parametrize(("codec", "group", "size", "count"), MATRIX)
def test_our_writer_their_reader(tmp_path, codec, group, size, count):
    records = make_records(size, count, seed=group + 1)
    path = tmp_path / "ours.array_record"
    with aioloader.ArrayRecordWriter(path, group_size=group, compression=codec) as w:
        for r in records:
            w.write(r)
    assert read_theirs(path) == records
    assert read_all_ours(path, verify="all") == records


def test_our_options_string_matches_theirs(tmp_path):
    for options in [
        "group_size:1,zstd:3",
        "group_size:7,uncompressed",
        "group_size:2,brotli:11,window_log:30",
        "group_size:1,snappy",
        "group_size:3,pad_to_block_boundary:true,zstd:-5,window_log:31",
    ]:
        write_theirs(tmp_path / "t.ar", [b"x"], options)
        with aioloader.ArrayRecordWriter(tmp_path / "o.ar", options=options) as w:
            w.write(b"x")
        theirs = LocalFile(tmp_path / "t.ar").reader().index.writer_options
        ours = LocalFile(tmp_path / "o.ar").reader().index.writer_options
        assert ours == theirs
        assert parse_options(ours) == parse_options(theirs)


def test_grain_reads_our_files(tmp_path):
    grain_sources = pytest.importorskip("grain.sources")
    records = make_records(300, 500)
    paths = []
    for shard in range(2):
        path = tmp_path / f"data-{shard:05d}-of-00002.array_record"
        with aioloader.ArrayRecordWriter(path) as w:
            for r in records[shard::2]:
                w.write(r)
        paths.append(str(path))
    src = grain_sources.ArrayRecordDataSource(paths)
    assert len(src) == len(records)
    expected = records[0::2] + records[1::2]
    assert [src[i] for i in range(len(src))] == expected


# -- edge cases of ARRAYRECORD_FORMAT.md §12 -------------------------------------------


def _roundtrip_both_ways(tmp_path, records, options):
    write_theirs(tmp_path / "theirs.ar", records, options)
    assert read_all_ours(tmp_path / "theirs.ar", verify="all") == records
    with aioloader.ArrayRecordWriter(tmp_path / "ours.ar", options=options) as w:
        for r in records:
            w.write(r)
    assert read_theirs(tmp_path / "ours.ar") == records
    return LocalFile(tmp_path / "theirs.ar").reader().index


def test_zero_records(tmp_path):
    index = _roundtrip_both_ways(tmp_path, [], "group_size:1,zstd:3")
    assert index.num_records == 0 and index.num_chunks == 0
    assert index.size == 2 * BLOCK_SIZE and index.footer_offset == 64


def test_zero_size_records_stretch_chunks(tmp_path):
    index = _roundtrip_both_ways(tmp_path, [b""] * 2500, "group_size:1000,zstd:3")
    # 1000 empty records compress to a tiny body, yet the chunk spans >= 1000 bytes.
    assert (index.chunk_ends - index.chunk_offsets)[:2].min() >= 1000


def _size_placing_second_chunk_at(target: int) -> int:
    """Record size (group 1, uncompressed) making chunk 1 start at physical `target`."""
    from aioloader.arrayrecord.layout import chunk_end
    from aioloader.arrayrecord.varint import encode_varint

    for n in range(target, 0, -1):
        data_size = 1 + 1 + len(encode_varint(n)) + n
        if chunk_end(64, data_size, 1) == target:
            return n
    raise AssertionError(f"no record size puts a chunk at {target}")


@pytest.mark.parametrize("offset_in_block", [BLOCK_SIZE - 20, 0, BLOCK_SIZE - 39, 25])
def test_chunk_header_split_or_aligned(tmp_path, offset_in_block):
    """A chunk whose header is split by a block header, or that starts on a boundary."""
    target = BLOCK_SIZE + offset_in_block if offset_in_block else BLOCK_SIZE
    first = _size_placing_second_chunk_at(target)
    records = [b"a" * first, b"second record", b"third"]
    index = _roundtrip_both_ways(tmp_path, records, "group_size:1,uncompressed")
    assert int(index.chunk_offsets[1]) == target
    if offset_in_block > BLOCK_SIZE - CHUNK_HEADER_SIZE:
        assert int(index.chunk_offsets[1]) % BLOCK_SIZE + CHUNK_HEADER_SIZE > BLOCK_SIZE


def test_uncompressed_output_is_byte_identical(tmp_path):
    records = make_records(1000, 200) + [b""] * 5 + make_records(70_000, 2)
    for options in ["group_size:1,uncompressed", "group_size:10,uncompressed",
                    "group_size:10,pad_to_block_boundary:true,uncompressed"]:
        write_theirs(tmp_path / "t.ar", records, options)
        with aioloader.ArrayRecordWriter(tmp_path / "o.ar", options=options) as w:
            for r in records:
                w.write(r)
        assert (tmp_path / "o.ar").read_bytes() == (tmp_path / "t.ar").read_bytes(), options


def test_pad_to_block_boundary(tmp_path):
    records = make_records(500, 40)
    index = _roundtrip_both_ways(tmp_path, records, "group_size:10,pad_to_block_boundary:true")
    assert index.chunk_offsets.tolist() == [64, BLOCK_SIZE, 2 * BLOCK_SIZE, 3 * BLOCK_SIZE]
    assert index.footer_offset == 4 * BLOCK_SIZE


def test_footer_spanning_blocks(tmp_path):
    records = [i.to_bytes(3, "little") for i in range(70_000)]
    index = _roundtrip_both_ways(tmp_path, records, "group_size:1,uncompressed")
    assert index.num_chunks == 70_000
    assert index.size - BLOCK_SIZE - index.footer_offset > 5 * BLOCK_SIZE


@pytest.mark.parametrize("options", ["zstd:19,window_log:31", "brotli:11,window_log:30",
                                     "zstd:-5,window_log:10", "brotli:6,window_log:24"])
def test_large_windows(tmp_path, options):
    records = make_records(100_000, 6)
    _roundtrip_both_ways(tmp_path, records, f"group_size:2,{options}")


def test_transposed_file_reads_like_theirs(tmp_path):
    records = [b"abc"] * 40 + [b"\x08\x96\x01", b""]
    write_theirs(tmp_path / "t.ar", records, "group_size:16,transpose")
    f = LocalFile(tmp_path / "t.ar")
    reader = f.reader()
    assert len(reader) == 42
    assert reader[3] == b"abc" and reader[40] == b"\x08\x96\x01"
    assert list(reader) == read_theirs(tmp_path / "t.ar") == records


def test_open_reads_tail_once(tmp_path):
    write_theirs(tmp_path / "t.ar", make_records(100, 1000), "group_size:1")
    f = LocalFile(tmp_path / "t.ar")
    f.reader()
    assert f.calls == 1  # postscript and footer from one speculative tail read
