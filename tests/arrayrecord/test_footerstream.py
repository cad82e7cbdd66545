"""A footer streamed in windows gives the index the whole-footer parse gives, or its error.

Streaming is forced here for footers of any size (`STREAM_FROM` 0) and tried at windows
from one byte (every block header and entry cut apart) to more than a block. Every group
size and codec is written; those streaming does not take (brotli, snappy) must come back
whole-parsed, the same. A flipped bit anywhere from the footer on, or a read cut short, is
the whole parse's answer too: the same index (the bit lay where no hash looks: padding), or
an `ArrayRecordFormatError`, never another index.
"""

from __future__ import annotations

import functools
import io
from contextlib import contextmanager

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader.arrayrecord.index as index_mod
from aioloader.arrayrecord import ArrayRecordWriter, read_index
from aioloader.arrayrecord import footerstream as fs
from aioloader.arrayrecord.codecs import ZSTD
from aioloader.arrayrecord.errors import ArrayRecordFormatError
from aioloader.arrayrecord.footer import _native
from aioloader.arrayrecord.layout import BLOCK_SIZE
from aioloader.arrayrecord.varint import encode_varint

pytestmark = pytest.mark.skipif(not fs.available(), reason="_footer / _highwayhash not built")

CODECS = ["uncompressed", "zstd:3", "zstd:19", "brotli:1", "snappy"]
WINDOWS = [1, 5, 31, 100, 4096, BLOCK_SIZE - 23, BLOCK_SIZE + 17, 1 << 20]
FEW = [7, 4096, BLOCK_SIZE + 17]  # (for the tests that open a file many times)
common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def _file(n: int, group: int, codec: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    w = ArrayRecordWriter(out, options=f"group_size:{group},{codec}")
    for k in range(n):
        w.write(rng.bytes(int(rng.integers(0, 40))) + k.to_bytes(4, "little"))
    w.close()
    return out.getvalue()


@contextmanager
def _streaming(window: int | None):
    """Stream every footer (`window` bytes a read), or none (None); yields what each
    `stream_footer` returned."""
    got: list = []
    real = fs.stream_footer

    def spy(*args, **kw):
        result = yield from real(*args, **{**kw, "window": window or kw["window"]})
        got.append(result)
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(index_mod, "STREAM_FROM", -1 if window else 1 << 62)
        mp.setattr(index_mod, "REMOTE_STREAM_FROM", -1 if window else 1 << 62)
        mp.setattr(fs, "stream_footer", spy)
        yield got


def _open(data: bytes, window: int | None, *, small: bool, cut: int | None = None,
          max_decoded: int = 1 << 30):
    """The index (as lists) or the error; by small reads, or (`small` False) by one read of
    the postscript's head and 64 bytes before it (the footer then read after it)."""
    stored = data if cut is None else data[: len(data) - cut]  # the object cut short

    def fetch(offset: int, length: int) -> bytes:
        return stored[offset : offset + length]

    with _streaming(window) as got:
        try:
            ix = read_index(len(data), fetch, small_reads=small, max_decoded=max_decoded,
                            span=None if small else 64)
        except ArrayRecordFormatError as err:
            return ("error", err.what), got
    return (ix.num_records, ix.max_records, ix.chunk_offsets.tolist(),
            ix.chunk_records.tolist(), ix.chunk_decoded_sizes.tolist(), ix.writer_options,
            ix.footer_offset), got


@settings(max_examples=40, **common)
@given(n=st.integers(1, 300), group=st.sampled_from([1, 1, 2, 3, 7]),
       codec=st.sampled_from(CODECS), window=st.sampled_from(WINDOWS),
       small=st.booleans(), seed=st.integers(0, 1 << 16))
def test_streaming_gives_the_whole_parse_index(n, group, codec, window, small, seed):
    data = _file(n, group, codec, seed)
    whole, _ = _open(data, None, small=small)
    streamed, got = _open(data, window, small=small)
    assert streamed == whole
    assert whole[0] == n
    streams = codec.split(":")[0] in ("uncompressed", "zstd")
    assert got and (got[-1] is not None) == streams


def test_a_file_of_many_chunks_streams_in_every_window_size():
    data = _file(3000, 1, "uncompressed", 7)  # a footer of several blocks
    whole, _ = _open(data, None, small=True)
    for window in WINDOWS:
        streamed, got = _open(data, window, small=True)
        assert streamed == whole and got[-1] is not None, window


@functools.cache
def _files() -> tuple[bytes, bytes]:
    """A group_size 1 file whose footer crosses a block boundary, and a zstd one."""
    return _file(7000, 1, "uncompressed", 1), _file(500, 2, "zstd:3", 2)


@settings(max_examples=60, **common)
@given(which=st.integers(0, 1), at=st.floats(0, 1), bit=st.integers(0, 7),
       window=st.sampled_from(FEW), small=st.booleans())
def test_a_flipped_bit_is_the_whole_parse_answer(which, at, bit, window, small):
    data = _files()[which]
    footer_offset = _open(data, None, small=True)[0][-1]
    pos = footer_offset + int(at * (len(data) - footer_offset - 1))
    bad = bytearray(data)
    bad[pos] ^= 1 << bit
    whole, _ = _open(bytes(bad), None, small=small)
    streamed, _ = _open(bytes(bad), window, small=small)
    assert streamed == whole, pos


@settings(max_examples=15, **common)
@given(cut=st.integers(1, 2 * BLOCK_SIZE), window=st.sampled_from(FEW))
def test_a_read_cut_short_is_the_whole_parse_answer(cut, window):
    data = _files()[0]
    whole, _ = _open(data, None, small=True, cut=cut)
    streamed, _ = _open(data, window, small=True, cut=cut)
    assert streamed == whole
    if cut > BLOCK_SIZE:  # the footer's last bytes are gone
        assert streamed[0] == "error" and "short read" in streamed[1]


def test_the_budget_counts_what_streaming_keeps():
    data = _files()[0]
    whole, _ = _open(data, None, small=True)
    m = whole[0]
    budget = fs.KEPT_PER_ENTRY * m + 8 + 3 * fs.MIN_WINDOW
    streamed, got = _open(data, 1 << 20, small=True, max_decoded=budget)  # windows shrunk
    assert streamed == whole and got[-1] is not None
    refused, got = _open(data, 1 << 20, small=True, max_decoded=budget - 1)
    assert got[-1] is None  # not streamed: read whole, whose own check decides
    assert refused == _open(data, None, small=True, max_decoded=budget - 1)[0]
    assert refused[0] == "error" and "memory budget" in refused[1]


@pytest.mark.parametrize("small", [True, False])
def test_a_genuine_file_opens_under_a_budget_smaller_than_the_default_windows(small):
    data = _files()[0]
    budget = 1 << 20  # holds this file's footer whole, not three windows of 1 MiB
    whole, _ = _open(data, None, small=small, max_decoded=budget)
    assert whole[0] == 7000
    streamed, got = _open(data, 1 << 20, small=small, max_decoded=budget)
    assert streamed == whole and got[-1] is not None


def test_a_footer_under_the_remote_threshold_is_read_whole_from_a_bucket(monkeypatch):
    data = _files()[0]
    footer_offset = _open(data, None, small=True)[0][-1]
    span = len(data) - BLOCK_SIZE - footer_offset
    monkeypatch.setattr(index_mod, "STREAM_FROM", span // 4)  # over it: streamed locally
    monkeypatch.setattr(index_mod, "REMOTE_STREAM_FROM", span)
    for small, most in ((False, 2), (True, 1 << 30)):
        requests: list[int] = []

        def fetch(offset: int, length: int, requests: list[int] = requests) -> bytes:
            requests.append(length)
            return data[offset : offset + length]

        ix = read_index(len(data), fetch, small_reads=small, max_decoded=1 << 30,
                        span=None if small else 64)
        assert ix.num_records == 7000 and len(requests) <= most
        if small:  # streamed in windows: no read holds the footer whole
            assert max(requests) < span


def _zstd_frame(window_log: int, n: int) -> bytes:
    params = zstandard.ZstdCompressionParameters.from_level(
        1, window_log=window_log, write_content_size=0)
    c = zstandard.ZstdCompressor(compression_params=params).compressobj()
    return c.compress(b"\x08" * n) + c.flush()


@pytest.fixture
def decompressors(monkeypatch):
    """The zstd decompressors made (noted by a wrapper: the C type is not to be subclassed,
    whose instances then crash the garbage collector)."""
    made: list = []
    real = zstandard.ZstdDecompressor

    def noted(*args, **kw):
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(zstandard, "ZstdDecompressor", noted)
    return made


def test_a_zstd_window_beyond_the_budget_is_refused_before_it_is_reserved(decompressors):
    n = 1 << 16
    stored = encode_varint(n) + _zstd_frame(31, n)  # 2 GiB window, no content size
    budget = fs._Budget(64 << 20)
    block = fs._Block(ZSTD, len(stored), n, n, lambda piece: None, exact=True, budget=budget)
    with pytest.raises(fs._Refused):
        for k in range(len(stored)):  # a byte at a time: the frame header comes in pieces
            block.feed(memoryview(stored)[k : k + 1])
    assert k < 20 and decompressors == [] and budget.left == 64 << 20


def test_a_zstd_window_within_the_budget_is_counted_then_given_back(decompressors):
    n = 1 << 16
    stored = encode_varint(n) + _zstd_frame(20, n)
    budget = fs._Budget(64 << 20)
    got: list[int] = []
    block = fs._Block(ZSTD, len(stored), n, n, lambda piece: got.append(len(piece)),
                      exact=True, budget=budget)
    for k in range(0, len(stored), 3):
        block.feed(memoryview(stored)[k : k + 3])
        if block.writer is not None:
            assert (64 << 20) - budget.left >= 1 << 20  # the window, counted while held
    block.finish()
    block.close()
    assert sum(got) == n and budget.left == 64 << 20
    assert [d.memory_size() for d in decompressors] and all(
        d.memory_size() < 2 << 20 for d in decompressors)

@pytest.mark.parametrize("state", [
    [-(1 << 40), 0, 0, 0, 0, 0],  # rows done: negative
    [5, 0, 0, 0, 0, 0],  # more rows done than the columns hold
    [0, -1, 0, 0, 0, 0],  # the last offset: negative
    [0, 0, -1, 0, 0, 0],  # the total: negative
])
def test_stream_entries_refuses_a_state_out_of_range(state):
    offsets, decoded = np.zeros(4, np.int64), np.zeros(4, np.uint32)
    with pytest.raises(ValueError, match="state"):
        _native.stream_entries(bytes([8, 100, 16, 5, 24, 1]), 1 << 20, offsets, decoded,
                               None, np.array(state, np.int64))


@pytest.mark.parametrize("state", [[-(1 << 40), 4, 0], [3, 2, 0], [0, 5, 0]])
def test_stream_sizes_refuses_a_state_out_of_range(state):
    offsets, decoded = np.zeros(4, np.int64), np.zeros(4, np.uint32)
    with pytest.raises(ValueError, match="state"):
        _native.stream_sizes(bytes([6]), offsets, decoded, None, np.array(state, np.int64))


def test_stream_entries_refuses_a_record_count_that_overflows_the_total():
    offsets, decoded = np.zeros(4, np.int64), np.zeros(4, np.uint32)
    records = np.ones(4, np.int64)
    state = np.array([1, 64, (1 << 63) - 2, 1, 0, 0], np.int64)
    entry = bytes([8, 0xC8, 0x01, 16, 5, 24, 3])  # offset 200, 5 bytes, 3 records
    _native.stream_entries(entry, 1 << 20, offsets, decoded, records, state)
    assert state[5] == 1 and state[0] == 1 and state[2] == (1 << 63) - 2
