"""The fetch stage (aioloader.source.fetch): raw chunks of group > 1 files are downloaded once.

Two tasks (batches) that touch the same chunk of a remote file share one download, whether
they ask at the same time (the read in flight is shared) or one after the other (the raw
chunk cache). Downloads are counted by the delay line in front of fake-gcs-server.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aioloader.source import ArrayRecordSource
from aioloader.testing import local_gcs

from ..support.arrayrecord_util import make_records, write_theirs

GROUP = 64


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True) as bucket:
        yield bucket


@pytest.fixture(scope="module")
def files(tmp_path_factory, gcs):
    """Two remote files: 640 records in chunks of 64, and 100 records one per chunk."""
    root = tmp_path_factory.mktemp("fetch")
    out = {}
    for name, group, count in [("grouped", GROUP, 640), ("single", 1, 100)]:
        path = root / f"{name}.ar"
        write_theirs(path, make_records(300, count, seed=group), f"group_size:{group},zstd:3")
        out[name] = (gcs.upload(path, f"fetch/{name}.ar"), path.read_bytes())
    return out


def _downloads(gcs) -> int:
    return gcs.proxy_stats.downloads


def _expected(blob: bytes, refs) -> list[bytes]:
    return [blob[s:e] for s, e in zip(refs.start.tolist(), refs.end.tolist())]


async def test_two_tasks_touching_one_chunk_fetch_it_once(gcs, files):
    url, blob = files["grouped"]
    async with ArrayRecordSource(url, storage_options=gcs.storage_options) as src:
        a, b = src.chunk_refs(range(0, 10)), src.chunk_refs(range(10, 20))  # both chunk 0
        n0 = _downloads(gcs)
        got_a, got_b = await asyncio.gather(src.fetch_refs(a), src.fetch_refs(b))
        assert _downloads(gcs) - n0 == 1  # the second shared the first's read in flight
        assert [bytes(v) for v in got_a] == _expected(blob, a)
        assert [bytes(v) for v in got_b] == _expected(blob, b)
        c = src.chunk_refs([30, 63, 64])  # chunk 0 again (cached), and chunk 1
        got_c = await src.fetch_refs(c)
        assert _downloads(gcs) - n0 == 2
        assert [bytes(v) for v in got_c] == _expected(blob, c)
        cache = src.fetcher.raw_cache
        assert (cache.misses, cache.hits, len(cache)) == (2, 2, 2)
        assert cache.bytes == sum(len(x) for x in {bytes(v) for v in got_c})


async def test_one_record_chunks_are_not_cached(gcs, files):
    url, blob = files["single"]
    async with ArrayRecordSource(url, storage_options=gcs.storage_options) as src:
        refs = src.chunk_refs([5, 6, 7])
        n0 = _downloads(gcs)
        first = await src.fetch_refs(refs)
        again = await src.fetch_refs(refs)
        assert _downloads(gcs) - n0 == 2  # nothing kept: an epoch reads each record once
        assert [bytes(v) for v in first] == [bytes(v) for v in again] == \
            _expected(blob, refs)
        assert len(src.fetcher.raw_cache) == 0


async def test_files_of_both_kinds_in_one_task(gcs, files):
    """Records of a grouped and a one-record file in one task, in any order: each gets its
    own chunk's bytes; only the grouped file's chunks are cached."""
    (g_url, g_blob), (s_url, s_blob) = files["grouped"], files["single"]
    async with ArrayRecordSource([g_url, s_url], storage_options=gcs.storage_options) as src:
        picks = np.random.default_rng(0).permutation(len(src))[:200]
        refs = src.chunk_refs(picks)
        got = await src.fetch_refs(refs)
        blobs = [g_blob, s_blob]
        ids = refs.ids[refs.file].tolist()
        assert [bytes(v) for v in got] == [
            blobs[f][s:e] for f, s, e in zip(ids, refs.start.tolist(), refs.end.tolist())]
        assert len(src.fetcher.raw_cache) == len({(f, c) for f, c in
                                                  zip(ids, refs.chunk.tolist()) if f == 0})


async def test_the_cache_is_bounded_in_bytes(gcs, files):
    url, blob = files["grouped"]
    async with ArrayRecordSource(url, storage_options=gcs.storage_options) as src:
        ix = src.file_indices[0]
    one_chunk = int((ix.chunk_ends - ix.chunk_offsets).max())
    async with ArrayRecordSource(url, storage_options=gcs.storage_options,
                                 cache_bytes=int(2.5 * one_chunk)) as src:
        for k in range(10):  # every chunk once, then the first again
            await src.fetch_refs(src.chunk_refs([k * GROUP]))
        cache = src.fetcher.raw_cache
        assert 0 < len(cache) <= 3 and cache.bytes <= cache.max_bytes
        n0 = _downloads(gcs)
        refs = src.chunk_refs([0])
        got = await src.fetch_refs(refs)  # long evicted: read again
        assert _downloads(gcs) - n0 == 1
        assert bytes(got[0]) == _expected(blob, refs)[0]


async def test_a_cancelled_reader_leaves_the_chunk_to_the_one_waiting(gcs, files):
    """The task that started a chunk's read is cancelled: the task sharing it reads the
    chunk itself, and gets the right bytes."""
    url, blob = files["grouped"]
    async with ArrayRecordSource(url, storage_options=gcs.storage_options) as src:
        a, b = src.chunk_refs([GROUP * 3]), src.chunk_refs([GROUP * 3 + 1])
        owner = asyncio.ensure_future(src.fetch_refs(a))
        waiter = asyncio.ensure_future(src.fetch_refs(b))
        await asyncio.sleep(0)  # both asked: the second waits on the first's read
        owner.cancel()
        got = await asyncio.wait_for(waiter, 10)
        assert bytes(got[0]) == _expected(blob, b)[0]
        with pytest.raises(asyncio.CancelledError):
            await owner
        n0 = _downloads(gcs)
        assert bytes((await src.fetch_refs(a))[0]) == _expected(blob, a)[0]
        assert _downloads(gcs) == n0  # cached by the waiter's own read


async def test_resident_copy_bypasses_the_cache(gcs, files):
    url, blob = files["grouped"]
    async with ArrayRecordSource(url, storage_options=gcs.storage_options,
                                 resident_bytes=1 << 30) as src:
        for lo in (0, 10):
            refs = src.chunk_refs(range(lo, lo + 10))
            assert [bytes(v) for v in await src.fetch_refs(refs)] == \
                _expected(blob, refs)
        assert src.resident is not None and len(src.fetcher.raw_cache) == 0


async def test_refs_carry_file_numbers_through_take_and_read_from(tmp_path):
    """Fetching goes by the source's file numbers, which `take` and `read_from` keep (the
    paths may be copies; URLs are never looked up again)."""
    paths, blobs = [], []
    for k in range(3):
        path = tmp_path / f"part-{k}.ar"
        write_theirs(path, make_records(50, 40, seed=k), "group_size:1")
        paths.append(path)
        blobs.append(path.read_bytes())
    async with ArrayRecordSource(paths) as src:
        refs = src.chunk_refs([5, 85, 45, 110])  # files 0, 2, 1, 2
        assert refs.ids.tolist() == [0, 1, 2] and refs.paths == src.urls
        part = refs.take(1, 3)  # files 2 and 1
        assert part.ids.tolist() == [1, 2] and part.paths == [src.urls[1], src.urls[2]]
        moved = part.read_from(["/nonexistent/a", "/nonexistent/b"], [0, 0])
        assert moved.ids.tolist() == [1, 2]
        got = await src.fetch_refs(moved)  # by number: the copies' paths are not read
        files = moved.ids[moved.file].tolist()
        assert files == [2, 1]
        assert [bytes(v) for v in got] == [blobs[f][s:e] for f, s, e in
                                           zip(files, moved.start.tolist(), moved.end.tolist())]
