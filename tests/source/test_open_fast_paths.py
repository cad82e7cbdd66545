"""Opening's short paths (the usual postscript parsed inline, the usual footer parsed and
checked in C) answer exactly as the general path: the same index for a good file, and for a
damaged one an error from the general path (a short path only ever declines)."""

from __future__ import annotations

import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader.arrayrecord.footer as footer
import aioloader.arrayrecord.index as index
import aioloader.arrayrecord.postscript as postscript
import aioloader.arrayrecord.quickopen as quickopen
from aioloader.arrayrecord import ArrayRecordFormatError, read_index
from aioloader.arrayrecord.layout import BLOCK_SIZE

from ..support.arrayrecord_util import make_records, write_theirs

OPTIONS = ["group_size:1", "group_size:1,uncompressed", "group_size:3,zstd:1"]
# A footer of ~24 KB, larger than the first footer read of `small_reads`, across a boundary.
BIG = "group_size:1,uncompressed,big"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast-open")
    out = {}
    for k, options in enumerate(OPTIONS):
        path = root / f"f{k}.ar"
        write_theirs(path, make_records(40, 50 + 7 * k, seed=k), options)
        out[options] = path.read_bytes()
    path = root / "big.ar"
    write_theirs(path, make_records(20, 3000, seed=9), "group_size:1,uncompressed")
    out[BIG] = path.read_bytes()
    return out


def _open(data: bytes, verify: str = "headers", small: bool = False, seen=None,
          span: int | None = None):
    def fetch(o, n):
        if seen is not None:
            seen.append((o, n))
        return data[o : o + n]

    try:
        ix = read_index(len(data), fetch, path="f", verify=verify, small_reads=small,
                        span=span)
    except ArrayRecordFormatError as err:
        return ("error", str(err))
    return ("ok", ix.footer_offset, ix.chunk_offsets.tolist(), ix.chunk_records.tolist(),
            ix.chunk_decoded_sizes.tolist(), ix.chunk_decoded_sizes.dtype.str,
            ix.num_records, ix.max_records, ix.writer_options)


def _general(data: bytes, verify: str = "headers"):
    """`_open` with the short paths off (the native opening's too)."""
    saved_quick, saved_native = postscript.quick_postscript, footer._native
    saved_small = quickopen._small_footer
    postscript.quick_postscript = lambda *a: None
    quickopen._small_footer = None
    if saved_native is not None:
        footer._native = types.SimpleNamespace(entries=saved_native.entries)
    try:
        return _open(data, verify)
    finally:
        postscript.quick_postscript, footer._native = saved_quick, saved_native
        quickopen._small_footer = saved_small


@pytest.mark.parametrize("options", OPTIONS)
def test_a_good_file_takes_the_short_paths_and_opens_alike(files, options, monkeypatch):
    data = files[options]
    pos = len(data) - BLOCK_SIZE
    assert postscript.quick_postscript(memoryview(data)[pos:], pos, "headers") is not None
    if footer._native is not None and hasattr(footer._native, "columns"):
        seen = []
        real = footer.decode_footer_data
        monkeypatch.setattr(quickopen, "_small_footer", None)  # (its own tests: test_quickopen)
        monkeypatch.setattr(index, "decode_footer_data",
                            lambda *a: seen.append(real(*a)) or seen[-1])
        assert _open(data)[0] == "ok" and seen[-1].checked is not None
        monkeypatch.undo()
    assert _open(data) == _general(data)
    assert _open(data, "none") == _general(data, "none")


@pytest.mark.parametrize("options", [*OPTIONS, BIG])
def test_small_reads_read_what_the_file_declares_and_open_alike(files, options):
    """`small_reads` reads the postscript's head and the footer up to its padding chunk's
    header — not the whole tail — and gives the same index as the tail read."""
    data = files[options]
    seen: list[tuple[int, int]] = []
    got = _open(data, small=True, seen=seen)
    assert got == _open(data) == _general(data)
    assert _open(data, "none", small=True) == _general(data, "none")
    footer_at = got[1]
    assert seen[0] == (len(data) - BLOCK_SIZE, index.POSTSCRIPT_PROBE)
    assert all(o == footer_at for o, _ in seen[1:]) and len(seen) <= 3
    read = sum(n for _, n in seen)
    assert read < 3 * index.FOOTER_PROBE if options != BIG else read < 80_000
    if options == BIG:  # the footer alone is larger than the first read: a second, exact
        assert len(seen) == 3 and seen[2][1] > index.FOOTER_PROBE
        assert footer_at // BLOCK_SIZE != (footer_at + seen[2][1]) // BLOCK_SIZE


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987])
def test_small_reads_open_alike_wherever_the_footer_and_its_padding_fall(tmp_path, count):
    """Footers ending near a boundary (a padding chunk across it, or none at all) and small
    footers anywhere in a block: the small reads cover the padding chunk's header."""
    for size in (1, 100, 3000):
        path = tmp_path / f"f{size}.ar"
        write_theirs(path, make_records(size, count, seed=count), "group_size:1")
        data = path.read_bytes()
        assert _open(data, small=True) == _open(data) == _general(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_damaged_tail_opens_or_fails_as_the_general_path_says(files, data):
    options = data.draw(st.sampled_from([*OPTIONS, BIG]))
    raw = bytearray(files[options])
    footer_at = _open(bytes(raw))[1]
    # Damage the footer or the postscript block: a byte, or a few bytes in a row.
    # footer-end: the footer's last bytes and its padding chunk's header (what small reads
    # read last); footer-padding: anywhere up to the postscript (mostly unread zeros).
    where = data.draw(st.sampled_from(["footer", "footer-end", "footer-padding", "postscript"]))
    need = index._footer_needs(bytes(raw[footer_at:]), footer_at, len(raw) - BLOCK_SIZE)
    lo, hi = ((footer_at, min(footer_at + 400, len(raw) - BLOCK_SIZE)) if where == "footer"
              else (footer_at, len(raw) - BLOCK_SIZE) if where == "footer-padding"
              else (footer_at + need - 120, footer_at + need) if where == "footer-end"
              else (len(raw) - BLOCK_SIZE, len(raw) - BLOCK_SIZE + 200))
    at = data.draw(st.integers(lo, hi - 1))
    for k in range(data.draw(st.integers(1, 3))):
        if at + k < len(raw):
            raw[at + k] = data.draw(st.integers(0, 255))
    damaged = bytes(raw)
    verify = data.draw(st.sampled_from(["headers", "none"]))
    span = data.draw(st.sampled_from(SPANS))
    assert _open(damaged, verify) == _general(damaged, verify) == \
        _open(damaged, verify, small=True) == _open(damaged, verify, span=span)


# `span`s: none before the postscript (the footer always by a second read), one that ends
# inside a footer, one that holds any footer of up to 64 KiB, more than any file here.
SPANS = [0, 1000, 2 * BLOCK_SIZE, 1 << 20]


@pytest.mark.parametrize("options", [*OPTIONS, BIG])
@pytest.mark.parametrize("span", SPANS)
def test_span_reads_the_footer_with_the_postscript_head_and_opens_alike(files, options,
                                                                         span):
    """`span` reads the `span` bytes before the postscript and the postscript's head in one
    request — a footer outside them in one more, exactly its range — and opens alike."""
    data = files[options]
    seen: list[tuple[int, int]] = []
    got = _open(data, small=False, seen=seen, span=span)
    assert got == _open(data) == _general(data)
    assert _open(data, "none", span=span) == _general(data, "none")
    post_at, footer_at = len(data) - BLOCK_SIZE, got[1]
    start = max(0, post_at - span)
    assert seen[0] == (start, post_at + index.POSTSCRIPT_PROBE - start)
    assert seen[1:] == ([] if footer_at >= start else [(footer_at, post_at - footer_at)])


def test_span_reads_an_unusual_postscript_block_whole(files):
    """A postscript the quick parse declines (here: its hash damaged) is read whole and
    named as the tail read names it."""
    data = bytearray(files[OPTIONS[0]])
    data[len(data) - BLOCK_SIZE + 3] ^= 0xFF  # the block header's hash
    seen: list[tuple[int, int]] = []
    got = _open(bytes(data), seen=seen, span=1 << 20)
    assert got == _open(bytes(data)) and got[0] == "error" and "postscript" in got[1]
    assert seen[1] == (len(data) - BLOCK_SIZE, BLOCK_SIZE)



def test_a_local_listing_is_one_job_of_regular_files_with_sizes_and_versions(tmp_path):
    import asyncio
    import os

    from aioloader.io.backends import LocalBackend, local_version

    (tmp_path / "a.ar").write_bytes(b"x" * 10)
    (tmp_path / "b.ar").mkdir()  # a directory that matches: not a file
    (tmp_path / "c.ar").symlink_to(tmp_path / "a.ar")  # a link to a file: listed
    (tmp_path / "d.ar").symlink_to(tmp_path / "gone")  # a dangling link: left out

    async def listing():
        backend = LocalBackend(2)
        try:
            return await backend.glob(str(tmp_path / "*.ar"))
        finally:
            await backend.aclose()

    got = asyncio.run(listing())
    version = local_version(os.stat(tmp_path / "a.ar"))
    assert [(os.path.basename(i.url), i.size, i.version) for i in got] == [
        ("a.ar", 10, version), ("c.ar", 10, version)]


def test_opening_many_remote_files_never_queues_a_read_past_its_deadline(tmp_path):
    """A read's deadline times the store, not our own queue: with 24 files, 2 reads in flight
    and ~0.2 s a request, the last tails would wait ~2 s for a slot, longer than the 1 s
    deadline each read has (it failed so, opening 2,000 shards from a slow bucket)."""
    import time

    import aioloader as al
    from aioloader.io.storage import RetryPolicy, Storage
    from aioloader.source import ArrayRecordSource
    from aioloader.testing import local_gcs

    with local_gcs(latency_ms=200) as gcs:
        for k in range(24):
            path = tmp_path / f"part-{k:02d}.ar"
            with al.ArrayRecordWriter(path, group_size=1) as w:
                w.write(b"%d" % k)
            gcs.upload(path, f"many/part-{k:02d}.ar")
        storage = Storage(storage_options=gcs.storage_options, concurrency=2,
                          retry=RetryPolicy(deadline=1.0, timeout=1.0, hedge_after=None))
        t0 = time.perf_counter()
        with ArrayRecordSource(gcs.url("many/part-*.ar"), storage=storage) as src:
            n = len(src)
            took = time.perf_counter() - t0
            assert n == 24 and (src[0], src[23]) == (b"0", b"23")
        assert took > 2.0 and storage.stats.failures == 0  # the queue did form
