"""Fuzzing the format parser: damaged files raise ArrayRecordFormatError, nothing else.

Mutations: random byte flips, truncations, and nonsense values in size fields, with the
chunk hashes recomputed afterwards so the lie gets past the hash checks. For every case the
reader must raise only `ArrayRecordFormatError` (or return records), never hang, and never
allocate far beyond the file's size. The short tier runs in `make test`; the 10,000-case
tier is marked slow (`make test-slow`).

Files damaged as storage damages them (tests/support/damage.py), read with default settings, must
give no wrong record without an error, and be refused wherever array_record's own reader
refuses them: a sample of every kind here, 960 files under `make test-slow`.
"""

from __future__ import annotations

import functools
import io
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader
from aioloader.arrayrecord import ArrayRecordFormatError, RangeReader
from aioloader.arrayrecord.hashing import highwayhash64
from aioloader.arrayrecord.index import decode_chunk, decode_records
from aioloader.arrayrecord.layout import BLOCK_SIZE, ChunkHeader, chunk_end, strip_block_headers

from ..support import damage

CODECS = ["uncompressed", "zstd:3", "snappy", "brotli:4"]
NONSENSE = [0, 1, 2**31, 2**40, 2**56 - 1, 2**63, 2**64 - 1]


@functools.cache
def base_file(codec: str, group: int) -> bytes:
    buf = io.BytesIO()
    with aioloader.ArrayRecordWriter(buf, group_size=group, compression=codec) as w:
        for i in range(12):
            w.write(bytes([i]) * (i * 37 % 300))
    return buf.getvalue()


@functools.cache
def chunk_header_positions(codec: str, group: int) -> tuple[int, ...]:
    """Physical positions of every chunk header (small files: none straddles a block)."""
    data = base_file(codec, group)
    out, pos = [], 0
    while pos < len(data):
        at = pos + 24 if pos % BLOCK_SIZE == 0 else pos
        h = ChunkHeader.parse(strip_block_headers(data[pos : pos + 64], pos))
        out.append(at)
        pos = chunk_end(pos, h.data_size, h.num_records)
    return tuple(out)


def rehash(buf: bytearray, positions) -> None:
    """Recompute data and header hashes of every chunk (fields may now lie)."""
    for h in positions:
        data_size = struct.unpack_from("<Q", buf, h + 8)[0]
        data = bytes(buf[h + 40 : h + 40 + min(data_size, BLOCK_SIZE)])
        struct.pack_into("<Q", buf, h + 16, highwayhash64(data))
        struct.pack_into("<Q", buf, h, highwayhash64(bytes(buf[h + 8 : h + 40])))


def exercise(data: bytes, verify: str) -> None:
    """Open and read everything; only ArrayRecordFormatError may escape."""
    view = memoryview(data)

    def fetch(offset: int, length: int) -> bytes:
        return bytes(view[offset : offset + length])

    tracemalloc.start()
    try:
        reader = RangeReader(fetch, len(data), path="fuzz.ar", verify=verify)
        list(reader)
        if len(reader):
            reader.read([len(reader) - 1, 0])
    except ArrayRecordFormatError as err:
        assert "fuzz.ar" in str(err)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 16 * len(data) + (4 << 20), f"allocated {peak} bytes for a {len(data)} file"


mutation = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 255)),
                                        min_size=1, max_size=8)),
    st.tuples(st.just("truncate"), st.integers(0, 2 * BLOCK_SIZE)),
    st.tuples(st.just("lie"), st.tuples(st.integers(0, 20), st.sampled_from([8, 24, 32]),
                                        st.sampled_from(NONSENSE), st.booleans())),
    st.tuples(st.just("lie_data"), st.tuples(st.integers(0, 20), st.integers(0, 400),
                                             st.integers(1, 255))),
)


def mutate(codec: str, group: int, kind: str, arg) -> bytes:
    buf = bytearray(base_file(codec, group))
    positions = chunk_header_positions(codec, group)
    if kind == "flip":
        for pos, xor in arg:
            buf[pos % len(buf)] ^= xor
    elif kind == "truncate":
        del buf[len(buf) - (arg % len(buf)) - 1 :]
        if arg % 2:
            buf += bytes(-len(buf) % BLOCK_SIZE)  # keep the size plausible
    elif kind == "lie":
        which, field, value, type_too = arg
        h = positions[which % len(positions)]
        if field == 24 and type_too:
            value = (value << 8) | 0x72  # a simple chunk with a nonsense record count
        struct.pack_into("<Q", buf, h + field, value % 2**64)
        rehash(buf, positions)
    else:  # a byte inside chunk data changed, with every hash made to agree
        which, offset, xor = arg
        h = positions[which % len(positions)]
        data_size = struct.unpack_from("<Q", buf, h + 8)[0]
        if data_size:
            buf[h + 40 + offset % data_size] ^= xor
        rehash(buf, positions)
    return bytes(buf)


def _fuzz(codec, group, m, verify):
    exercise(mutate(codec, group, *m), verify)


common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
args = (st.sampled_from(CODECS), st.sampled_from([1, 3]), mutation,
        st.sampled_from(["none", "headers", "all"]))


@settings(max_examples=1000, **common)
@given(*args)
def test_fuzz_short(codec, group, m, verify):
    _fuzz(codec, group, m, verify)


@pytest.mark.slow
@settings(max_examples=10_000, **common)
@given(*args)
def test_fuzz_long(codec, group, m, verify):
    _fuzz(codec, group, m, verify)


@pytest.mark.parametrize("codec", CODECS)
def test_valid_base_files_read_back(codec):
    data = base_file(codec, 3)
    reader = RangeReader(lambda o, n: data[o : o + n], len(data), verify="all")
    assert list(reader) == [bytes([i]) * (i * 37 % 300) for i in range(12)]


def test_not_an_arrayrecord_file():
    data = b"PK\x03\x04" + bytes(2 * BLOCK_SIZE - 4)
    with pytest.raises(ArrayRecordFormatError, match=r"zip\.ar.*postscript.*not an ArrayRecord"):
        RangeReader(lambda o, n: data[o : o + n], len(data), path="zip.ar")


@pytest.mark.parametrize("size", [0, 100, BLOCK_SIZE, 2 * BLOCK_SIZE + 1])
def test_bad_sizes_say_truncated(size):
    data = bytes(size)
    with pytest.raises(ArrayRecordFormatError, match="truncated"):
        RangeReader(lambda o, n: data[o : o + n], len(data), path="short.ar")


def test_short_read_is_reported():
    data = base_file("zstd:3", 1)
    with pytest.raises(ArrayRecordFormatError, match="short read"):
        RangeReader(lambda o, n: data[o : o + n - 1], len(data), path="changing.ar")


def test_corrupted_data_caught_by_verify_all_only():
    data = bytearray(base_file("uncompressed", 1))
    positions = chunk_header_positions("uncompressed", 1)
    h = positions[2]  # [signature, chunk 0, chunk 1, ...]: chunk 1 holds record 1
    data[h + 40 + 5] ^= 0x20  # inside the record bytes
    damaged = bytes(data)
    fetch = lambda o, n: damaged[o : o + n]  # noqa: E731
    assert RangeReader(fetch, len(damaged), verify="headers")[1] != bytes([1]) * 37
    with pytest.raises(ArrayRecordFormatError, match="data hash") as info:
        RangeReader(fetch, len(damaged), path="bad.ar", verify="all")[1]
    assert "bad.ar" in str(info.value) and "chunk 1" in str(info.value)


def _one(fn):
    try:
        return ("ok", fn())
    except ArrayRecordFormatError as err:
        return ("error", str(err))


@settings(max_examples=400, **common)
@given(st.sampled_from(["uncompressed", "zstd:3"]), mutation,
       st.sampled_from(["none", "headers", "all"]))
def test_batched_decode_agrees_with_decode_chunk(codec, m, verify):
    """The workers' batched decoder (its inline path for one-record chunks) returns exactly
    what `decode_chunk` returns, or the same error, on every chunk of a damaged file."""
    data = mutate(codec, 1, *m)
    positions = chunk_header_positions(codec, 1)
    starts = [at - 24 if at % BLOCK_SIZE == 24 else at for at in positions]  # physical
    # Every chunk after the file signature, each with its whole range (as the footer gives).
    for start, stop in zip(starts[1:], [*starts[2:], len(data)]):
        raw = data[start:stop]
        got = _one(lambda raw=raw, start=start: decode_records(
            [raw], [start], [0], verify=verify, paths=["fuzz.ar"], chunks=[7])[0])
        want = _one(lambda raw=raw, start=start: decode_chunk(
            raw, start, verify=verify, path="fuzz.ar", chunk=7, whole_range=True)[1].record(0))
        assert got == want


def _flipped_record_file(tmp_path) -> str:
    """Ten uncompressed records, one bit of `record-5` flipped (it now reads `record-4`)."""
    path = tmp_path / "flipped.array_record"
    with aioloader.ArrayRecordWriter(path, compression="uncompressed") as w:
        for i in range(10):
            w.write(b"record-%d" % i)
    data = bytearray(path.read_bytes())
    data[data.index(b"record-5") + 7] ^= 1
    path.write_bytes(bytes(data))
    return str(path)


@pytest.mark.parametrize("how", ["getitem", "loader0", "loader1"])
def test_default_verify_refuses_a_flipped_bit_in_a_record(tmp_path, how):
    """With no options, a bit flipped inside a record's bytes is an error naming the file
    and chunk (as Google's reader refuses it), never the wrong record."""
    import asyncio

    path = _flipped_record_file(tmp_path)

    async def drain(workers: int) -> list:
        out = []
        async with aioloader.Dataset.from_arrayrecord(path).batch(10).loader(
                workers=workers) as it:
            async for batch in it:
                out.extend(batch)
        return out

    with pytest.raises(ArrayRecordFormatError, match="data hash") as info:
        if how == "getitem":
            with aioloader.ArrayRecordSource(path) as src:
                src[5]
        else:
            asyncio.run(drain(int(how[-1])))
    assert "flipped.array_record" in str(info.value) and "chunk 5" in str(info.value)


def _damage_fuzz(cases) -> dict[str, int]:
    totals, problems = damage.run(cases)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])
    assert totals["silent"] == 0 and totals["we_refused"] == totals["they_refused"], totals
    # The damage is real: array_record refuses most files, and never returns a wrong record.
    assert totals["they_refused"] > totals["files"] // 2 and totals["they_silent"] == 0, totals
    return totals


def test_damaged_files_sample_no_silent_records():
    """72 damaged files: every writer, codec, group size and kind of damage (a stride
    coprime with the 24 configurations walks through all of them)."""
    _damage_fuzz(range(0, 504, 7))


@pytest.mark.slow
def test_damaged_files_no_silent_records():
    """960 damaged files, 40 per configuration (both writers, transposed, every codec, group
    sizes 1 and 5), every kind of damage: 0 silent records with default settings."""
    totals = _damage_fuzz(range(960))
    assert totals["files"] >= 400
