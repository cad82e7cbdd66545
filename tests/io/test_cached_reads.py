"""Local reads the page cache holds go in one job first; the others (which may wait for a
disk) are read as before; the bytes, order and I/O counts are the same either way."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

from aioloader.io import descriptors
from aioloader.io.descriptors import FileSet
from aioloader.io.storage import CACHED_READ_MAX, Storage

pytestmark = pytest.mark.skipif(not descriptors.CACHED_READS,
                                reason="no RWF_NOWAIT reads on this system")


def _files(tmp_path, n: int, size: int) -> list[str]:
    paths = []
    for k in range(n):
        p = tmp_path / f"f{k:03d}.bin"
        p.write_bytes(os.urandom(size))
        paths.append(str(p))
    return paths


def _evict(path: str) -> None:
    """The file's pages out of the page cache (clean pages: written back first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cached(path: str) -> bool:
    return FileSet().pread_cached(path, 16, 0) is not None


def _requests(paths: list[str]) -> list[tuple[str, int, int]]:
    """Small reads of every file (a few per file, out of order), and one large one."""
    out = []
    for k, p in enumerate(paths):
        out += [(p, 100 + k, 612 + k), (p, 0, 64), (p, 4096, 4096 + CACHED_READ_MAX)]
    out.append((paths[0], 0, 3 * CACHED_READ_MAX))  # (large: never tried from the cache)
    return out[::-1]


def _expected(requests):
    out = []
    for path, start, end in requests:
        with open(path, "rb") as f:
            f.seek(start)
            out.append(f.read(end - start))
    return out


def _read_many(requests) -> tuple[list[bytes], dict]:
    async def go():
        st = Storage()
        try:
            return await st.read_many(requests), st.stats.as_dict()
        finally:
            await st.aclose()

    return asyncio.run(go())


def test_reads_the_page_cache_holds_and_those_it_does_not_give_the_same_bytes(tmp_path):
    paths = _files(tmp_path, 40, 3 * CACHED_READ_MAX)
    requests = _requests(paths)
    want = _expected(requests)  # (every file in the page cache now)
    got, stats = _read_many(requests)
    assert got == want
    assert stats["reads"] == stats["requests"] == len(requests)
    assert stats["bytes"] == sum(len(b) for b in want)
    evicted = paths[::3]
    for p in evicted:
        _evict(p)
    if any(_cached(p) for p in evicted):
        pytest.skip("this file system keeps pages that were asked to go")
    got, stats = _read_many(requests)  # some from the cache, the rest by the threads
    assert got == want
    assert stats["reads"] == stats["requests"] == len(requests)
    assert stats["bytes"] == sum(len(b) for b in want)


def test_a_read_the_cache_holds_only_in_part_is_read_whole(tmp_path):
    (path,) = _files(tmp_path, 1, 1 << 20)
    _evict(path)
    fd = os.open(path, os.O_RDONLY)
    try:  # the first page back in the cache, not the rest (no readahead)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, 100, 0)
    finally:
        os.close(fd)
    if _cached(path) is False or FileSet().pread_cached(path, 3 * 4096, 0) is not None:
        pytest.skip("this file system read ahead, or keeps pages that were asked to go")
    got, _ = _read_many([(path, 0, 3 * 4096), (path, 10, 20)])
    assert got == _expected([(path, 0, 3 * 4096), (path, 10, 20)])


def test_a_file_system_without_cache_only_reads_is_read_as_before(tmp_path, monkeypatch):
    """A file system that refuses RWF_NOWAIT (EOPNOTSUPP; a real one cannot be made to on
    demand here, hence the stand-in): every read goes to the threads, and the loader stops
    asking."""
    paths = _files(tmp_path, 5, 3 * CACHED_READ_MAX)
    requests = _requests(paths)
    calls = []

    def refuse(fd, buffers, offset, flags=0):
        calls.append(flags)
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(os, "preadv", refuse)
    monkeypatch.setattr(descriptors, "CACHED_READS", True)
    got, stats = _read_many(requests)
    assert got == _expected(requests)
    assert stats["reads"] == len(requests)
    assert calls == [descriptors._NOWAIT]  # asked once, then never again
    assert descriptors.CACHED_READS is False


def test_a_missing_file_is_still_named(tmp_path):
    paths = _files(tmp_path, 3, 8192)
    gone = str(tmp_path / "gone.bin")
    with pytest.raises(FileNotFoundError, match=r"gone\.bin"):  # (it said "None" before)
        _read_many([(paths[0], 0, 10), (gone, 0, 10), (paths[1], 0, 10)])
