"""TFRecord's index by a scan and its records by range (`aioloader.formats.tfrecord`): the
scan finds every record whatever the read windows; every damage to a file is an error naming
the file, the record and its byte offset, found before anything is allocated from a declared
length; the payload checksum is checked as `verify` says."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader import formats
from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.formats.tfrecord import (
    OVERHEAD,
    TFRecordFormatError,
    _masked_crc_8,
    frame,
    masked_crc,
    scan,
)

TF = formats.get("tfrecord")


def _index(data: bytes, *, verify: str = "all", window: int = 1 << 16, reads=None):
    """Drive the scan over `data` (each read recorded in `reads`)."""
    steps = scan(len(data), path="f.tfrecord", verify=verify, window=window)
    try:
        at, n = next(steps)
        while True:
            if reads is not None:
                reads.append((at, n))
            at, n = steps.send(data[at : at + n])
    except StopIteration as done:
        return done.value


def _file(records: list[bytes]) -> bytes:
    return b"".join(frame(r) for r in records)


def _payloads(data: bytes, index, verify: str = "all") -> list[bytes]:
    starts, ends = index.chunk_offsets.tolist(), index.chunk_ends.tolist()
    return TF.decode_records([data[a:b] for a, b in zip(starts, ends)], starts,
                             [0] * len(starts), verify=verify,
                             paths=["f.tfrecord"] * len(starts),
                             chunks=list(range(len(starts))), counts=None,
                             max_decoded=1 << 30)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 70_000), max_size=30),
       window=st.sampled_from([1 << 16, 1 << 17, 1 << 20]))
def test_the_scan_finds_every_record_whatever_the_windows(sizes, window):
    records = [bytes([k % 251]) * n for k, n in enumerate(sizes)]
    data = _file(records) or frame(b"")
    if not records:
        records = [b""]
    index = _index(data, window=window)
    assert index.num_records == index.num_chunks == len(records)
    assert index.one_record_chunks and index.footer_offset == len(data)
    assert index.chunk_decoded_sizes.tolist() == [len(r) for r in records]
    assert (index.chunk_ends - index.chunk_offsets).tolist() == \
        [len(r) + OVERHEAD for r in records]
    assert _payloads(data, index) == records


def test_a_record_longer_than_a_window_is_skipped_not_read():
    data = _file([b"a", b"x" * (1 << 20), b"b"])
    reads: list = []
    index = _index(data, window=1 << 16, reads=reads)
    assert index.num_records == 3
    assert sum(n for _, n in reads) < 3 << 16  # the big payload was never read


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.binary(min_size=8, max_size=8), min_size=1, max_size=50))
def test_the_vectorized_header_checksum_is_the_c_implementations(rows):
    got = _masked_crc_8(np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(-1, 8))
    assert got.tolist() == [masked_crc(r) for r in rows]


def test_the_masked_crc_is_tensorflows():
    # tf.io's masked crc32c of b"" and of the length 0 (u64), as TFRecord writers store them
    assert masked_crc(b"") == 0xA282EAD8
    assert frame(b"")[:12] == struct.pack("<QI", 0, masked_crc(struct.pack("<Q", 0)))


def _error(data: bytes, **kw) -> TFRecordFormatError:
    with pytest.raises(TFRecordFormatError) as got:
        _index(data, **kw)
    assert isinstance(got.value, ArrayRecordFormatError)  # handled as any damaged file
    assert "f.tfrecord" in str(got.value)
    return got.value


def test_a_zero_length_file_holds_no_records():
    assert _index(b"").num_records == 0


@pytest.mark.parametrize("cut", [1, 5, 11, 12, 13, 20, 25])
def test_a_truncated_file_names_the_record_and_offset(cut):
    good = _file([b"0123456789", b"abcdefghij"])  # records of 26 bytes each
    err = _error(good[: 26 + cut])
    assert err.chunk == 1 and err.offset == 26
    assert "record 1" in str(err) and "byte 26" in str(err)


def test_a_lying_length_is_refused_before_anything_is_allocated():
    head = struct.pack("<Q", 1 << 62)
    lying = frame(b"ok") + head + struct.pack("<I", masked_crc(head)) + b"tiny"
    err = _error(lying)
    assert err.offset == 18 and err.chunk == 1
    assert f"{1 << 62:,}" in str(err) and "left" in str(err)


def test_a_bad_length_checksum_is_an_error_unless_verify_is_none():
    data = bytearray(_file([b"first", b"second"]))
    data[21 + 9] ^= 0xFF  # the second record's length checksum
    err = _error(bytes(data))
    assert err.offset == 21 and "length's checksum" in str(err)
    assert _index(bytes(data), verify="none").num_records == 2


def test_a_compressed_file_says_to_convert_it():
    import gzip

    err = _error(gzip.compress(_file([b"x" * 100] * 10)))
    assert err.offset == 0 and "aioloader convert" in str(err)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB", "gzip"])
def test_compression_is_refused_by_name(compression):
    import aioloader as al

    with pytest.raises(ValueError, match="aioloader convert"):
        al.Dataset.from_tfrecord("x.tfrecord", compression=compression)
    with pytest.raises(ValueError, match="aioloader convert"):
        al.TFRecordSource("x.tfrecord", compression=compression)


def test_the_payload_checksum_is_checked_when_verify_says():
    data = bytearray(_file([b"hello", b"world"]))
    index = _index(bytes(data))
    data[21 + 12 + 2] ^= 0x01  # a bit of the second payload
    with pytest.raises(TFRecordFormatError, match="payload's checksum") as got:
        _payloads(bytes(data), index, verify="all")
    assert got.value.offset == 21
    assert _payloads(bytes(data), index, verify="headers")[1] == b"wo" + bytes([ord("r") ^ 1]) \
        + b"ld"


def test_a_range_that_no_longer_holds_its_record_is_an_error():
    data = _file([b"hello", b"world"])
    index = _index(data)
    other = _file([b"hellO!", b"world"])  # rewritten: the ranges no longer fit
    with pytest.raises(TFRecordFormatError, match="declares 6 bytes"):
        _payloads(other, index)


def test_errors_keep_their_type_across_processes():
    import pickle

    err = TFRecordFormatError("x", path="p", offset=3, chunk=2, hint="h")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is TFRecordFormatError and str(back) == str(err)
    assert str(err) == "p, record 2, byte 3: x (h)"


def test_the_index_is_lean_and_bounded_like_arrayrecords():
    data = _file([b"r%d" % i for i in range(1000)])
    index = _index(data)
    assert index.chunk_records.strides == (0,)  # a broadcast of ones
    assert index.chunk_decoded_sizes.dtype == np.uint32
    assert index.bounds is not None and index.bounds[-1] == len(data)
    assert TF.index_limits(len(data)) == (0, len(data))


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12), data=st.data())
def test_any_flipped_bit_is_an_error_naming_the_file(sizes, data):
    """CRC32C catches every one-bit error: in a length, a payload or a checksum, the scan or
    the read (verify="all") says so; nothing else is raised and nothing is returned."""
    good = _file([bytes([k]) * n for k, n in enumerate(sizes)])
    bit = data.draw(st.integers(0, len(good) * 8 - 1))
    bad = bytearray(good)
    bad[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(TFRecordFormatError, match=r"f\.tfrecord"):
        _payloads(bytes(bad), _index(bytes(bad)))


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12), data=st.data())
def test_a_file_cut_anywhere_is_an_error_or_its_whole_records(sizes, data):
    records = [bytes([k]) * n for k, n in enumerate(sizes)]
    good = _file(records)
    cut = data.draw(st.integers(1, len(good)))
    ends = np.cumsum([len(r) + OVERHEAD for r in records]).tolist()
    if cut in ends:  # a cut between records leaves a shorter, valid file
        assert _payloads(good[:cut], _index(good[:cut])) == records[: ends.index(cut) + 1]
    else:
        with pytest.raises(TFRecordFormatError, match=r"f\.tfrecord"):
            _index(good[:cut])


@pytest.mark.parametrize("path,kind", [
    ("d/train.tfrecord", "tfrecord"), ("d/train.tfrecord-00001-of-00008", "tfrecord"),
    ("d/train.tfrecord[10:20]", "tfrecord"), ("d/train-[0-9].tfrecord", "tfrecord"),
    ("gs://b/x/*.TFRecords", "tfrecord"), ("d/train-[0-9].array_record", "arrayrecord"),
    ("d/a.array_record[0:5]", "arrayrecord"),
])
def test_a_files_name_suggests_its_format_globs_and_read_instructions_included(path, kind):
    from aioloader.formats import guess

    assert guess(path) == kind
