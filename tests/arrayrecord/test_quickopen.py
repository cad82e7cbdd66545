"""The native opening of the usual small file (`quickopen`: the postscript and the footer, one
C call each) gives exactly the general path's `FileIndex`, for files from our writer and from
array_record's; declines a damaged file, which the general path then names; and is simply
not used where the extension is absent."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
import aioloader.arrayrecord.postscript as postscript
import aioloader.arrayrecord.quickopen as quickopen
from aioloader.arrayrecord import ArrayRecordFormatError, read_index
from aioloader.arrayrecord.codecs import _decompress
from aioloader.arrayrecord.hashing import highwayhash64
from aioloader.arrayrecord.layout import BLOCK_SIZE
from aioloader.elements.typed import ElementSpec

from ..support.arrayrecord_util import make_records, write_theirs

native = pytest.mark.skipif(not quickopen.available(), reason="_footer not built")

CODECS = ["uncompressed", "zstd:1", "brotli:1", "snappy"]


def _ours(records: list[bytes], group_size: int, codec: str, spec: bool) -> bytes:
    buf = io.BytesIO()
    kw = {"element_spec": ElementSpec.array("<f4", (4,))} if spec else {}
    with al.ArrayRecordWriter(buf, group_size=group_size, compression=codec, **kw) as w:
        for r in records:
            w.write(r)
    return buf.getvalue()


def _theirs(records: list[bytes], group_size: int, codec: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.ar")
        write_theirs(path, records, f"group_size:{group_size},{codec}")
        with open(path, "rb") as f:
            return f.read()


def _index(data: bytes, verify: str = "all", small: bool = True, counts: list | None = None):
    """The index as comparable values (every field, dtype and derived figure), or the error.
    (Not whether the offsets are a view of the table's bounds: the native path's always are,
    the general path's only for group_size 1; the values are the same.)"""
    calls = [0, 0]
    small_footer, post = quickopen._small_footer, quickopen._postscript

    def counted(k, fn):
        def call(*args):
            got = fn(*args)
            calls[k] += got is not None
            return got
        return call

    if small_footer is not None:
        quickopen._small_footer = counted(0, small_footer)
        quickopen._postscript = counted(1, post)
    try:
        ix = read_index(len(data), lambda o, n: data[o : o + n], path="f.ar", verify=verify,
                        small_reads=small)
    except ArrayRecordFormatError as err:
        return ("error", str(err))
    finally:
        quickopen._small_footer, quickopen._postscript = small_footer, post
    if counts is not None:
        counts[:] = calls
    cols = (ix.chunk_offsets, ix.chunk_records, ix.chunk_decoded_sizes)
    return ("ok", ix.path, ix.size, ix.footer_offset, ix.writer_options, ix.element_spec,
            ix.num_records, ix.max_records, ix.one_record_chunks,
            [(c.dtype.str, c.strides, c.tolist()) for c in cols], ix.chunk_ends.tolist())


def _general(data: bytes, verify: str = "all", small: bool = True):
    """`_index` with the native opening off (the general path's answer)."""
    saved = quickopen._small_footer, quickopen._postscript
    quickopen._small_footer = quickopen._postscript = None
    try:
        return _index(data, verify, small)
    finally:
        quickopen._small_footer, quickopen._postscript = saved


@native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writer=st.sampled_from(["ours", "theirs"]), group_size=st.sampled_from([1, 2, 7]),
       codec=st.sampled_from(CODECS), count=st.integers(1, 400), size=st.integers(0, 300),
       spec=st.booleans(), seed=st.integers(0, 3))
def test_the_native_opening_gives_the_general_paths_index(writer, group_size, codec, count,
                                                          size, spec, seed):
    records = make_records(size, count, seed=seed)
    data = (_ours(records, group_size, codec, spec) if writer == "ours" else
            _theirs(records, group_size, codec))
    counts: list[int] = []
    got = _index(data, counts=counts)
    assert got[0] == "ok" and counts == [1, 1]  # the usual file: both parses native
    assert got == _general(data)
    assert _index(data, small=False) == _general(data, small=False) == got
    assert _index(data, "none") == _general(data, "none") == got


@native
def test_a_large_footer_across_a_block_boundary_opens_alike(tmp_path):
    """A footer of ~24 KB (more than the first read of small reads) crossing a block
    boundary: the second, exact read is parsed natively too, block header and all."""
    path = tmp_path / "big.ar"
    write_theirs(path, make_records(20, 3000, seed=9), "group_size:1,uncompressed")
    data = path.read_bytes()
    counts: list[int] = []
    got = _index(data, counts=counts)
    footer_at = got[3]
    assert footer_at // BLOCK_SIZE != (len(data) - BLOCK_SIZE - 1) // BLOCK_SIZE
    assert counts == [1, 1] and got == _general(data)


@pytest.fixture(scope="module")
def usual() -> dict[str, bytes]:
    return {codec: _theirs(make_records(60, 80, seed=3), 1, codec) for codec in CODECS} | {
        "group_size:3": _theirs(make_records(60, 80, seed=4), 3, "zstd:3")}


@native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_damaged_file_fails_as_the_general_path_says(usual, data):
    """Bytes changed anywhere in the footer chunk, its padding chunk's header or the
    postscript: the native parses decline, and the error is the general path's."""
    raw = bytearray(usual[data.draw(st.sampled_from(sorted(usual)))])
    post_at = len(raw) - BLOCK_SIZE
    footer_at = _general(bytes(raw))[3]
    where = data.draw(st.sampled_from(["footer", "postscript"]))
    lo, hi = ((footer_at, min(footer_at + 600, post_at)) if where == "footer" else
              (post_at, post_at + 160))
    at = data.draw(st.integers(lo, hi - 1))
    for k in range(data.draw(st.integers(1, 3))):
        raw[at + k] = data.draw(st.integers(0, 255))
    damaged = bytes(raw)
    verify = data.draw(st.sampled_from(["all", "none"]))
    small = data.draw(st.booleans())
    assert _index(damaged, verify, small) == _general(damaged, verify, small)


@native
def test_each_check_declines_and_the_general_path_names_it(usual):
    data = usual["zstd:1"]
    post_at = len(data) - BLOCK_SIZE
    footer_at = _general(data)[3]
    want = post_at - footer_at

    def footer(raw: bytes, verify: bool = True, budget: int = 1 << 30):
        return quickopen._small_footer(raw[footer_at:post_at], footer_at, post_at, budget,
                                       verify, highwayhash64, _decompress)

    assert footer(data) is not None
    assert footer(data, budget=100) is None  # over the memory budget: the general path says
    flipped = bytearray(data)
    flipped[footer_at + 50] ^= 1  # in the chunk's data: its hash
    assert footer(bytes(flipped)) is None
    assert "hash mismatch" in _general(bytes(flipped))[1]
    assert footer(bytes(flipped), verify=False) is None or \
        _general(bytes(flipped), "none")[0] == "ok"
    # The range cut short of the padding chunk's header: declined, whatever else holds.
    assert quickopen._small_footer(data[footer_at : footer_at + 60], footer_at, post_at,
                                   1 << 30, True, highwayhash64, _decompress) is None
    assert want > 60
    # The postscript: the usual one, and with its hash damaged.
    head = data[post_at : post_at + 512]
    assert quickopen._postscript(head, post_at, len(data), True, highwayhash64) == footer_at
    bad = bytearray(head)
    bad[30] ^= 1
    assert quickopen._postscript(bytes(bad), post_at, len(data), True, highwayhash64) is None
    assert postscript.quick_postscript(bytes(bad), post_at, "all", len(data)) is None


@native
def test_the_native_calls_refuse_bad_arguments():
    with pytest.raises(TypeError):
        quickopen._postscript(b"")
    with pytest.raises(TypeError):
        quickopen._small_footer(b"", 64, 100)
    with pytest.raises(TypeError):  # not a buffer
        quickopen._small_footer(5, 64, 100, 1 << 20, True, highwayhash64, _decompress)
    assert quickopen._small_footer(b"", 64, 100, 1 << 20, True, highwayhash64,
                                   _decompress) is None
    assert quickopen._postscript(b"\x00" * 10, BLOCK_SIZE, 2 * BLOCK_SIZE, True,
                                 highwayhash64) is None


def test_without_the_extension_the_general_path_opens_alike(tmp_path):
    """`_footer` not importable (a build without a compiler): the native opening is simply
    not used, and a file opens to the same index."""
    path = tmp_path / "f.ar"
    write_theirs(path, make_records(30, 50, seed=1), "group_size:1,zstd:3")
    script = (
        "import sys; sys.modules['aioloader.arrayrecord._footer'] = None\n"
        "import aioloader.arrayrecord.quickopen as q\n"
        "from aioloader.arrayrecord import read_index\n"
        f"data = open({str(path)!r}, 'rb').read()\n"
        "ix = read_index(len(data), lambda o, n: data[o:o + n], small_reads=True)\n"
        "print(q.available(), ix.footer_offset, ix.num_records, ix.chunk_offsets.sum(),\n"
        "      ix.chunk_decoded_sizes.dtype)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, check=True, timeout=120).stdout.split()
    data = path.read_bytes()
    ix = read_index(len(data), lambda o, n: data[o : o + n], small_reads=True)
    assert out == ["False", str(ix.footer_offset), str(ix.num_records),
                   str(ix.chunk_offsets.sum()), str(ix.chunk_decoded_sizes.dtype)]


def _in_child(code: str, timeout: float = 20) -> str:
    """Run `code` in a fresh interpreter (a hang or a crash there fails the test, not the run)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


@native
def test_positions_past_any_file_are_declined_at_once():
    """An offset near the int64 limit: declined (the general path names it), not a wrapped
    loop over the block boundaries."""
    out = _in_child(
        "from aioloader.arrayrecord import _footer\n"
        "from aioloader.arrayrecord.hashing import highwayhash64 as h\n"
        "from aioloader.arrayrecord.codecs import _decompress as d\n"
        "top = 2**63 - 1\n"
        "print(_footer.small_footer(bytes(100), top - 65536, top, 1 << 30, False, h, d),\n"
        "      _footer.small_footer(bytes(100), 1 << 62, (1 << 62) + 100, 1 << 30, True, h, d),\n"
        "      _footer.small_footer(bytes(5000), 64, top, 1 << 30, True, h, d),\n"
        "      _footer.postscript(bytes(200), top - top % 65536, top, True, h))\n"
    )
    assert out.split() == ["None"] * 4


@native
def test_a_view_kept_by_a_callback_is_released(usual):
    """The buffers handed to `hash64` and `decompress` are views of memory the call owns:
    a callback that keeps one finds it released, not reading freed memory."""
    data = usual["zstd:1"]
    post_at = len(data) - BLOCK_SIZE
    footer_at = _general(data)[3]
    kept: list[memoryview] = []

    def hash64(view):
        kept.append(view)
        return highwayhash64(view)

    def decompress(codec, block, expected, max_size):
        kept.append(block)
        return _decompress(codec, block, expected, max_size)

    assert quickopen._postscript(data[post_at:], post_at, len(data), True, hash64) == footer_at
    assert quickopen._small_footer(data[footer_at:post_at], footer_at, post_at, 1 << 30, True,
                                   hash64, decompress) is not None
    assert len(kept) > 3
    for view in kept:
        with pytest.raises(ValueError, match="released"):
            bytes(view)


@native
@pytest.mark.parametrize("which", ["hash64", "decompress"])
def test_an_interrupt_in_a_callback_propagates(usual, which):
    """A callback's ordinary error declines the native parse (the general path then says
    what is wrong); an interrupt or exit is not swallowed."""
    data = usual["zstd:1"]
    post_at = len(data) - BLOCK_SIZE
    footer_at = _general(data)[3]

    def raising(kind):
        def call(*args):
            raise kind("from the callback")
        return call

    def footer(kind):
        hash64 = raising(kind) if which == "hash64" else highwayhash64
        decompress = raising(kind) if which == "decompress" else _decompress
        return quickopen._small_footer(data[footer_at:post_at], footer_at, post_at, 1 << 30,
                                       True, hash64, decompress)

    assert footer(ValueError) is None
    with pytest.raises(KeyboardInterrupt):
        footer(KeyboardInterrupt)
    with pytest.raises(SystemExit):
        footer(SystemExit)
    if which == "hash64":
        assert quickopen._postscript(data[post_at:], post_at, len(data), True,
                                     raising(ValueError)) is None
        with pytest.raises(KeyboardInterrupt):
            quickopen._postscript(data[post_at:], post_at, len(data), True,
                                  raising(KeyboardInterrupt))
