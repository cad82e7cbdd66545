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
from aioloader.arrayrecord import ArrayRecordFormatError, read_index
from aioloader.arrayrecord.layout import BLOCK_SIZE

from .arrayrecord_util import make_records, write_theirs

OPTIONS = ["group_size:1", "group_size:1,uncompressed", "group_size:3,zstd:1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast-open")
    out = {}
    for k, options in enumerate(OPTIONS):
        path = root / f"f{k}.ar"
        write_theirs(path, make_records(40, 50 + 7 * k, seed=k), options)
        out[options] = path.read_bytes()
    return out


def _open(data: bytes, verify: str = "headers"):
    try:
        ix = read_index(len(data), lambda o, n: data[o : o + n], path="f", verify=verify)
    except ArrayRecordFormatError as err:
        return ("error", str(err))
    return ("ok", ix.footer_offset, ix.chunk_offsets.tolist(), ix.chunk_records.tolist(),
            ix.chunk_decoded_sizes.tolist(), ix.chunk_decoded_sizes.dtype.str,
            ix.num_records, ix.max_records, ix.writer_options)


def _general(data: bytes, verify: str = "headers"):
    """`_open` with both short paths off."""
    saved_quick, saved_native = index._quick_postscript, footer._native
    index._quick_postscript = lambda *a: None
    if saved_native is not None:
        footer._native = types.SimpleNamespace(entries=saved_native.entries)
    try:
        return _open(data, verify)
    finally:
        index._quick_postscript, footer._native = saved_quick, saved_native


@pytest.mark.parametrize("options", OPTIONS)
def test_a_good_file_takes_the_short_paths_and_opens_alike(files, options, monkeypatch):
    data = files[options]
    pos = len(data) - BLOCK_SIZE
    assert index._quick_postscript(memoryview(data)[pos:], pos, "headers") is not None
    if footer._native is not None and hasattr(footer._native, "columns"):
        seen = []
        real = footer.decode_footer_data
        monkeypatch.setattr(index, "decode_footer_data",
                            lambda *a: seen.append(real(*a)) or seen[-1])
        assert _open(data)[0] == "ok" and seen[-1].checked is not None
        monkeypatch.undo()
    assert _open(data) == _general(data)
    assert _open(data, "none") == _general(data, "none")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_damaged_tail_opens_or_fails_as_the_general_path_says(files, data):
    options = data.draw(st.sampled_from(OPTIONS))
    raw = bytearray(files[options])
    footer_at = _open(bytes(raw))[1]
    # Damage the footer or the postscript block: a byte, or a few bytes in a row.
    where = data.draw(st.sampled_from(["footer", "postscript"]))
    lo, hi = ((footer_at, min(footer_at + 400, len(raw) - BLOCK_SIZE)) if where == "footer"
              else (len(raw) - BLOCK_SIZE, len(raw) - BLOCK_SIZE + 200))
    at = data.draw(st.integers(lo, hi - 1))
    for k in range(data.draw(st.integers(1, 3))):
        if at + k < len(raw):
            raw[at + k] = data.draw(st.integers(0, 255))
    damaged = bytes(raw)
    verify = data.draw(st.sampled_from(["headers", "none"]))
    assert _open(damaged, verify) == _general(damaged, verify)



def test_a_local_listing_is_one_job_of_regular_files_with_sizes_and_versions(tmp_path):
    import asyncio
    import os

    from aioloader.backends import LocalBackend

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
    mtime = str(os.stat(tmp_path / "a.ar").st_mtime_ns)
    assert [(os.path.basename(i.url), i.size, i.version) for i in got] == [
        ("a.ar", 10, mtime), ("c.ar", 10, mtime)]


def test_opening_many_remote_files_never_queues_a_read_past_its_deadline(tmp_path):
    """A read's deadline times the store, not our own queue: with 24 files, 2 reads in flight
    and ~0.2 s a request, the last tails would wait ~2 s for a slot, longer than the 1 s
    deadline each read has (it failed so, opening 2,000 shards from a slow bucket)."""
    import time

    import aioloader as al
    from aioloader.source import ArrayRecordSource
    from aioloader.storage import RetryPolicy, Storage
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
