"""HighwayHash-64: spec test vectors, C extension vs pure-Python reference, buffer handling."""

from __future__ import annotations

import importlib
import os
import struct
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.arrayrecord import _highwayhash
from aioloader.arrayrecord.hashing import (
    HAVE_NATIVE,
    RIEGELI_KEY,
    HashStream,
    highwayhash64,
    highwayhash64_pair,
    highwayhash64_py,
)


def u64le(x: int) -> bytes:
    return struct.pack("<Q", x)


# From ARRAYRECORD_FORMAT.md section 3 (verified there against real files).
SPEC_VECTORS = [
    (b"", 0x72C3B1E9C0139FE1),
    (u64le(0) + u64le(64), 0x3F4A880DD170AF83),  # the first block header
    (u64le(0) + u64le(0x72C3B1E9C0139FE1) + u64le(0x73) + u64le(0), 0xA9E187923CC2BA91),
]

IMPLEMENTATIONS = {
    "public": highwayhash64,
    "c": _highwayhash.hash64,
    "c_key": lambda data: _highwayhash.hash64_key(RIEGELI_KEY, data),
    "py": highwayhash64_py,
}


def test_native_module_in_use() -> None:
    assert HAVE_NATIVE
    assert highwayhash64 is _highwayhash.hash64


def test_key_constant() -> None:
    assert len(RIEGELI_KEY) == 32
    assert struct.unpack("<4Q", RIEGELI_KEY) == (
        0x2F696C6567656952,
        0x0A7364726F636572,
        0x2F696C6567656952,
        0x0A7364726F636572,
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())
@pytest.mark.parametrize(("data", "expected"), SPEC_VECTORS, ids=["empty", "block", "sig"])
def test_spec_vectors(impl, data: bytes, expected: int) -> None:
    assert impl(data) == expected


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=300), key=st.binary(min_size=32, max_size=32))
def test_c_matches_python_random(data: bytes, key: bytes) -> None:
    assert _highwayhash.hash64_key(key, data) == highwayhash64_py(data, key)


# --- every native implementation (portable C, AVX2) against the Python reference -------------

NATIVE_IMPLS = list(_highwayhash.IMPLS)


def _cpu_has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False


def test_fastest_implementation_is_chosen() -> None:
    """On a CPU with AVX2 the vector path is the one in use (the portable loop is ~5x slower)."""
    assert _highwayhash.IMPL in NATIVE_IMPLS
    assert "portable" in NATIVE_IMPLS
    if sys.platform == "linux" and _cpu_has_avx2() and os.uname().machine == "x86_64":
        assert _highwayhash.IMPL == "avx2"


@pytest.mark.parametrize("impl", NATIVE_IMPLS)
@pytest.mark.parametrize(("data", "expected"), SPEC_VECTORS, ids=["empty", "block", "sig"])
def test_spec_vectors_each_impl(impl: str, data: bytes, expected: int) -> None:
    assert _highwayhash.hash64_impl(impl, RIEGELI_KEY, data) == expected


@pytest.mark.parametrize("impl", NATIVE_IMPLS)
def test_every_length_0_to_200_random_keys(impl: str) -> None:
    """Each length (every remainder mod 32, up to six whole packets) with its own random key."""
    rng = np.random.default_rng(13)
    for n in range(201):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        key = rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
        assert _highwayhash.hash64_impl(impl, key, data) == highwayhash64_py(data, key), n


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=0, max_size=200), key=st.binary(min_size=32, max_size=32),
       impl=st.sampled_from(NATIVE_IMPLS))
def test_impl_matches_python_random(data: bytes, key: bytes, impl: str) -> None:
    assert _highwayhash.hash64_impl(impl, key, data) == highwayhash64_py(data, key)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 70_000), offset=st.integers(0, 31), seed=st.integers(0, 2**32 - 1))
def test_impls_agree_on_long_unaligned_inputs(n: int, offset: int, seed: int) -> None:
    """Long inputs (cheap to check C against C) at every alignment of the start address."""
    rng = np.random.default_rng(seed)
    buf = memoryview(rng.integers(0, 256, n + offset, dtype=np.uint8).tobytes())[offset:]
    key = rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
    results = {impl: _highwayhash.hash64_impl(impl, key, buf) for impl in NATIVE_IMPLS}
    assert len(set(results.values())) == 1, results
    assert _highwayhash.hash64_key(key, buf) == results["portable"]


@settings(max_examples=300, deadline=None)
@given(na=st.integers(0, 70_000), nb=st.integers(0, 70_000), offset=st.integers(0, 31),
       seed=st.integers(0, 2**32 - 1))
def test_pair_is_two_hashes(na: int, nb: int, offset: int, seed: int) -> None:
    """`highwayhash64_pair` (two inputs in lockstep, then each one's own tail) is exactly
    two `highwayhash64` calls, whichever input is longer, at any alignment."""
    rng = np.random.default_rng(seed)
    a = memoryview(rng.integers(0, 256, na + offset, dtype=np.uint8).tobytes())[offset:]
    b = rng.integers(0, 256, nb, dtype=np.uint8).tobytes()
    assert highwayhash64_pair(a, b) == (highwayhash64(a), highwayhash64(b))
    assert highwayhash64_pair(b, a) == (highwayhash64(b), highwayhash64(a))
    if na < 200:
        assert highwayhash64(a) == highwayhash64_py(a)


def test_pair_rejects_what_hash64_rejects() -> None:
    with pytest.raises(TypeError, match="exactly 2"):
        highwayhash64_pair(b"x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="buffer protocol"):
        highwayhash64_pair(b"x", "y")  # type: ignore[arg-type]


def test_unknown_impl_rejected() -> None:
    with pytest.raises(ValueError, match="not available"):
        _highwayhash.hash64_impl("neon-on-x86", RIEGELI_KEY, b"")
    with pytest.raises(TypeError):
        _highwayhash.hash64_impl(b"portable", RIEGELI_KEY, b"")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="32 bytes"):
        _highwayhash.hash64_impl("portable", b"short", b"")


def _pattern(n: int) -> bytes:
    # Deterministic bytes that differ at every position (a pure counter repeats every 256).
    rng = np.random.default_rng(n)
    return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("n", [*range(130), 1000, 4096, 65543])
def test_c_matches_python_lengths(n: int) -> None:
    data = _pattern(n)
    assert _highwayhash.hash64(data) == highwayhash64_py(data)
    key = bytes(range(100, 132))
    assert _highwayhash.hash64_key(key, data) == highwayhash64_py(data, key)


def test_results_are_u64_and_key_sensitive() -> None:
    data = _pattern(77)
    values = {highwayhash64(data), highwayhash64(data[:-1]), highwayhash64(b"\0" + data[1:])}
    assert len(values) == 3
    assert all(0 <= v < 2**64 for v in values)
    other_key = bytes(32)
    assert _highwayhash.hash64_key(other_key, data) != _highwayhash.hash64(data)


# --- buffer protocol ------------------------------------------------------------------------


@pytest.mark.parametrize("impl", [_highwayhash.hash64, highwayhash64_py], ids=["c", "py"])
def test_unaligned_memoryview_slices(impl) -> None:
    base = _pattern(5000)
    view = memoryview(base)
    for offset in range(9):
        for length in (0, 1, 7, 31, 32, 33, 100, 4096 - offset):
            chunk = view[offset : offset + length]
            assert impl(chunk) == highwayhash64_py(bytes(chunk))
    # A large unaligned slice, so the GIL-released path sees an odd address.
    big = memoryview(_pattern(1 << 17))[3:]
    assert _highwayhash.hash64(big) == _highwayhash.hash64(bytes(big))


def test_buffer_types_agree() -> None:
    raw = _pattern(1234)
    expected = highwayhash64(raw)
    arr = np.frombuffer(raw, dtype=np.uint8).copy()
    inputs = [
        bytearray(raw),
        memoryview(raw),
        arr,
        arr.reshape(2, 617),  # multi-dimensional but C-contiguous: its raw bytes are hashed
        memoryview(bytearray(b"xx" + raw))[2:],
        np.frombuffer(b"\0" + raw, dtype=np.uint8)[1:],  # numpy view at an odd address
    ]
    for obj in inputs:
        assert _highwayhash.hash64(obj) == expected, type(obj)
        assert _highwayhash.hash64_key(RIEGELI_KEY, obj) == expected
        assert highwayhash64_py(obj) == expected
    # Wider dtypes hash their raw little-endian bytes.
    words = np.arange(40, dtype="<u8")
    assert _highwayhash.hash64(words) == highwayhash64_py(words.tobytes())
    # Keys may be any 32-byte buffer too.
    key = bytearray(range(32))
    assert _highwayhash.hash64_key(memoryview(key), raw) == highwayhash64_py(raw, bytes(key))


NON_CONTIGUOUS = {
    "memoryview_step": lambda: memoryview(bytes(range(64)))[::2],
    "numpy_step": lambda: np.arange(64, dtype=np.uint8)[::2],
    "numpy_fortran": lambda: np.asfortranarray(np.arange(64, dtype=np.uint8).reshape(8, 8)),
}


@pytest.mark.parametrize("make", NON_CONTIGUOUS.values(), ids=NON_CONTIGUOUS.keys())
@pytest.mark.parametrize(
    "impl",
    [_highwayhash.hash64, lambda d: _highwayhash.hash64_key(RIEGELI_KEY, d), highwayhash64_py],
    ids=["c", "c_key", "py"],
)
def test_non_contiguous_rejected(make, impl) -> None:
    with pytest.raises((TypeError, ValueError, BufferError)):
        impl(make())


@pytest.mark.parametrize("impl", [_highwayhash.hash64, highwayhash64_py], ids=["c", "py"])
@pytest.mark.parametrize("bad", ["text", 12, None, [1, 2]])
def test_non_buffer_rejected(impl, bad) -> None:
    with pytest.raises(TypeError):
        impl(bad)


@pytest.mark.parametrize("key", [b"", bytes(31), bytes(33)])
def test_bad_key_length(key: bytes) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        _highwayhash.hash64_key(key, b"abc")
    with pytest.raises(ValueError, match="32 bytes"):
        highwayhash64_py(b"abc", key)


def test_wrong_arg_count() -> None:
    with pytest.raises(TypeError):
        _highwayhash.hash64()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _highwayhash.hash64(b"a", b"b")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _highwayhash.hash64_key(RIEGELI_KEY)  # type: ignore[call-arg]


def test_fallback_warns_once_and_stays_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the extension, importing `hashing` warns once and falls back to pure Python."""
    import aioloader.arrayrecord as package

    monkeypatch.setitem(sys.modules, "aioloader.arrayrecord._highwayhash", None)
    monkeypatch.delitem(sys.modules, "aioloader.arrayrecord.hashing")
    monkeypatch.delattr(package, "_highwayhash", raising=False)
    monkeypatch.delattr(package, "hashing", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = importlib.import_module("aioloader.arrayrecord.hashing")
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1
    assert "C extension" in str(runtime[0].message)
    assert "compiler" in str(runtime[0].message)
    assert not fallback.HAVE_NATIVE and fallback.NATIVE_IMPL is None
    for data, expected in SPEC_VECTORS:
        assert fallback.highwayhash64(data) == expected


# --- against files written by the official library ------------------------------------------


def test_hashes_in_official_array_record_file(tmp_path) -> None:
    """Every block header, chunk header and data hash in a real file must match ours.

    Uncompressed single-record chunks give data hashes over many lengths (every remainder
    mod 32), one chunk crosses a block boundary, and the file ends with padding chunks.
    """
    arm = pytest.importorskip("array_record.python.array_record_module")
    path = str(tmp_path / "t.array_record")
    writer = arm.ArrayRecordWriter(path, "group_size:1,uncompressed")
    for n in [*range(70), 1000, 70000]:
        writer.write(_pattern(n))
    writer.close()
    with open(path, "rb") as f:
        raw = f.read()

    block = 1 << 16
    for b in range(0, len(raw), block):  # block header: hash of bytes 8..24
        assert struct.unpack_from("<Q", raw, b)[0] == highwayhash64(raw[b + 8 : b + 24])
    # Drop the block headers to get the logical stream. Here chunks follow each other with
    # no gaps, up to the first padding chunk (which ends the footer).
    logical = b"".join(raw[b + 24 : b + block] for b in range(0, len(raw), block))
    pos = checked = 0
    while True:
        header_hash, data_size, data_hash, type_and_count = struct.unpack_from("<4Q", logical, pos)
        assert header_hash == highwayhash64(logical[pos + 8 : pos + 40])
        data = logical[pos + 40 : pos + 40 + data_size]
        assert data_hash == highwayhash64(data)
        if data_size <= 200:
            assert data_hash == highwayhash64_py(data)
        checked += 1
        if type_and_count & 0xFF == ord("p"):
            break
        pos += 40 + data_size
    assert checked == 1 + 72 + 1 + 1  # signature, data chunks, footer, padding


def test_large_input_releases_gil_without_corruption() -> None:
    """Hash big buffers from several threads at once; results must match a serial run."""
    from concurrent.futures import ThreadPoolExecutor

    buffers = [os.urandom((1 << 20) + i) for i in range(8)]
    serial = [highwayhash64(b) for b in buffers]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(highwayhash64, buffers)) == serial


# --- data hashes on the workers' batched decoder -------------------------------------------


def _one_record_chunks(codec: str) -> tuple[list[bytes], list[int], list[bytes]]:
    """A group_size 1 file's data chunks as (physical bytes, start offset), and its records."""
    import io

    import aioloader
    from aioloader.arrayrecord import read_index

    records = [_pattern(n)[: n // 2] + b"ab" * (n // 4) for n in range(50, 1050, 50)]
    buf = io.BytesIO()
    with aioloader.ArrayRecordWriter(buf, group_size=1, compression=codec) as w:
        for r in records:
            w.write(r)
    data = buf.getvalue()
    index = read_index(len(data), lambda o, n: data[o : o + n])
    starts, ends = index.chunk_offsets.tolist(), index.chunk_ends.tolist()
    return [data[s:e] for s, e in zip(starts, ends, strict=True)], starts, records


@pytest.mark.parametrize("codec", ["zstd:3", "uncompressed"])
def test_batched_decode_checks_data_hashes_inline(codec: str, monkeypatch) -> None:
    """verify="all" keeps the one-record fast path (checking the data hash there) instead of
    falling back to `decode_chunk` for every record, which made it cost ~60% more per text
    record than "headers"; a damaged chunk still gets the general path's named error."""
    from aioloader.arrayrecord import ArrayRecordFormatError, index
    from aioloader.arrayrecord.layout import CHUNK_HEADER_SIZE

    raws, starts, records = _one_record_chunks(codec)
    within = [0] * len(raws)

    def general_path(*args, **kwargs):
        raise AssertionError("decode_chunk called for an intact one-record chunk")

    with monkeypatch.context() as m:
        m.setattr(index, "decode_chunk", general_path)
        assert index.decode_records(raws, starts, within, verify="all") == records

    damaged = list(raws)
    bad = bytearray(damaged[3])
    bad[CHUNK_HEADER_SIZE + 10] ^= 0x01  # the data, not the header: only the data hash sees it
    damaged[3] = bytes(bad)
    names = [f"f{k}.ar" for k in range(len(raws))]
    with pytest.raises(ArrayRecordFormatError, match="data hash") as info:
        index.decode_records(damaged, starts, within, verify="all", paths=names,
                             chunks=list(range(len(raws))))
    assert "f3.ar" in str(info.value) and "chunk 3" in str(info.value)


@pytest.mark.parametrize("impl", NATIVE_IMPLS)
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=12))
def test_a_hash_fed_in_pieces_is_the_hash_of_the_whole(impl, data, cuts):
    stream = HashStream(impl)
    at = 0
    for cut in [*sorted(cuts), len(data)]:
        stream.update(data[at : max(at, cut)])
        at = max(at, cut)
    assert stream.digest() == highwayhash64(data) == highwayhash64_py(data)


def test_a_hash_stream_names_an_implementation_this_machine_has():
    with pytest.raises(ValueError, match="not available"):
        HashStream("neon-on-x86").update(bytes(64))
