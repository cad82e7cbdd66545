"""Local reads the page cache holds go in one job first; the others (which may wait for a
disk) are read as before; the bytes, order and I/O counts are the same either way."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

from aioloader.io import descriptors
from aioloader.io.backends import LocalBackend
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


def _read_many(requests, **kw) -> tuple[list[bytes], dict]:
    async def go():
        st = Storage(**kw)
        try:
            return await st.read_many(requests), st.stats.as_dict()
        finally:
            await st.aclose()

    return asyncio.run(go())


@pytest.fixture
def cached_jobs(monkeypatch):
    """Each page-cache job's reads: (bytes asked, reads served)."""
    jobs = []
    real = LocalBackend.read_cached

    async def spy(self, items):
        got = await real(self, items)
        jobs.append((sum(e - s for _, s, e in items), sum(d is not None for d in got)))
        return got

    monkeypatch.setattr(LocalBackend, "read_cached", spy)
    return jobs


def test_reads_the_page_cache_holds_and_those_it_does_not_give_the_same_bytes(tmp_path,
                                                                              cached_jobs):
    paths = _files(tmp_path, 40, 3 * CACHED_READ_MAX)
    requests = _requests(paths)
    want = _expected(requests)  # (every file in the page cache now)
    got, stats = _read_many(requests)
    assert got == want
    small = sum(e - s <= CACHED_READ_MAX for _, s, e in requests)
    assert sum(served for _, served in cached_jobs) == small  # all from the cache
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


def test_a_kernel_without_cache_only_reads_is_read_as_before(tmp_path, monkeypatch):
    """A kernel without RWF_NOWAIT (ENOSYS; a real one cannot be had on demand here, hence
    the stand-in): every read goes to the threads, and the loader stops asking."""
    paths = _files(tmp_path, 5, 3 * CACHED_READ_MAX)
    requests = _requests(paths)
    calls = []

    def refuse(fd, buffers, offset, flags=0):
        calls.append(flags)
        raise OSError(errno.ENOSYS, "not implemented")

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


def test_the_page_cache_jobs_stay_within_the_byte_budget(tmp_path, cached_jobs):
    paths = _files(tmp_path, 30, 3 * CACHED_READ_MAX)
    requests = [(p, 0, CACHED_READ_MAX) for p in paths]
    budget = 4 * CACHED_READ_MAX
    got, _ = _read_many(requests, max_inflight_bytes=budget)
    assert got == _expected(requests)
    assert len(cached_jobs) > 1 and all(asked <= budget // 2 for asked, _ in cached_jobs)


def test_a_file_system_that_refuses_cache_only_reads_is_read_as_before(tmp_path):
    """tmpfs (/dev/shm here) refuses RWF_NOWAIT: its files are read by the threads, and
    the files of other file systems still from the page cache."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no tmpfs apart from the temporary directory")
    (disk,) = _files(tmp_path, 1, 8192)
    mem = os.path.join(shm, f"aioloader-test-{os.getpid()}.bin")
    with open(mem, "wb") as f:
        f.write(os.urandom(8192))
    try:
        reader = FileSet()
        if reader.pread_cached(mem, 100, 0) is not None:
            pytest.skip("this tmpfs takes RWF_NOWAIT")
        assert os.stat(mem).st_dev in descriptors.NO_CACHED_READS
        assert descriptors.CACHED_READS
        assert reader.pread_cached(disk, 100, 0) is not None
        requests = [(mem, 0, 100), (disk, 0, 100), (mem, 50, 4000), (disk, 10, 20)]
        got, stats = _read_many(requests)
        assert got == _expected(requests)
        assert stats["reads"] == len(requests)
        reader.close()
    finally:
        os.unlink(mem)
