"""The byte path (aioloader.source.bytepath): each link serves a task's chunk refs or passes
them on, over real tiers and the emulated bucket (reads over HTTP); what a task carries
decodes to the files' records whichever link served it, and the link that served says which
task size applies."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from aioloader.cache.disk import DiskCache
from aioloader.cache.tier import DiskTier
from aioloader.io.storage import Storage
from aioloader.source import ArrayRecordSource
from aioloader.source.bytepath import Bucket, BytePath, DiskStore, LocalStore, MemoryTier
from aioloader.testing import local_gcs
from aioloader.workers.decode import Decoder

from ..runtime.test_pipeline import _write
from ..support.arrayrecord_util import read_theirs

N = 1500
SEGMENT = 16 << 10  # max_inflight_bytes / 4: the segment size of both tiers


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("bytepath"), n=N, shards=4)


@pytest.fixture(scope="module")
def bucket(data):
    with local_gcs() as gcs:
        yield gcs, [gcs.upload(p, f"bp/{os.path.basename(p)}") for p in data]


@pytest.fixture(scope="module")
def theirs(data):
    return [r for p in data for r in read_theirs(p)]


ORDER = np.random.default_rng(0).permutation(N)[:200]


def _records(carry):
    """What a worker reads from what the task carries."""
    decoder = Decoder()
    try:
        return decoder.records(carry.refs, carry.raws)
    finally:
        decoder.files.close()


def _remote(gcs, urls, **kw):
    storage = Storage(max_inflight_bytes=4 * SEGMENT, storage_options=gcs.storage_options)
    return ArrayRecordSource(urls, storage=storage, **kw), storage


def test_a_local_file_is_a_store_the_worker_reads(data, theirs):
    with ArrayRecordSource(data) as src:
        path = BytePath(src)
        refs = src.chunk_refs(ORDER)
        path.advise(lambda: pytest.fail("no tier to hint"))
        carry = src._sync(path.serve(refs))
    assert path.links == [path.store] and isinstance(path.store, LocalStore)
    assert carry.link is path.store and carry.link.own_files
    assert carry.refs is refs and carry.raws is None and carry.release is None
    assert _records(carry) == [theirs[i] for i in ORDER.tolist()]
    assert path.serving() is path.store


async def test_without_tiers_the_bucket_serves_the_bytes(bucket, theirs):
    gcs, urls = bucket
    src, storage = _remote(gcs, urls)
    try:
        await src.aopen()
        path = BytePath(src)
        hints = []
        path.advise(lambda: hints.append(1))
        carry = await path.serve(src.chunk_refs(ORDER))
    finally:
        await src.aclose()
        await storage.aclose()
    assert [type(link) for link in path.links] == [MemoryTier, Bucket]
    assert src.resident is None and hints == [1]  # (a tier of 0 bytes: none kept)
    assert carry.link is path.store and not carry.link.own_files
    assert carry.raws is not None and _records(carry) == [theirs[i] for i in ORDER.tolist()]


async def test_records_a_horizons_stash_holds_carry_nothing_and_size_tasks_as_local_ones(
        bucket):
    """The stash serves outside the chain: no bytes read, nothing pinned, and tasks grow
    as for local files while it serves; the next task the chain serves sizes them again."""
    gcs, urls = bucket
    src, storage = _remote(gcs, urls)
    try:
        await src.aopen()
        path = BytePath(src)
        refs = src.chunk_refs(ORDER)
        held = await path.serve(refs, stashed=True)
        assert held.link is path.stashed and path.serving() is path.stashed
        assert held.refs is refs and held.raws is None and held.release is None
        assert not held.link.own_files and path.stashed not in path.links
        after = await path.serve(refs)
        assert after.link is path.store and path.serving() is path.store
    finally:
        await src.aclose()
        await storage.aclose()


async def test_the_memory_tier_serves_once_its_segments_are_in(bucket, theirs):
    gcs, urls = bucket
    src, storage = _remote(gcs, urls, resident_bytes=1 << 30)  # kept whole
    try:
        await src.aopen()
        path = BytePath(src)
        refs = src.chunk_refs(ORDER)
        first = await path.serve(refs)  # the very first read: passed on, record by record
        assert first.link is path.store and first.raws is not None
        again = await path.serve(refs)
        assert again.link is path.memory and path.serving() is path.memory
        assert again.raws is None and set(again.refs.paths) == {src.resident.worker_path}
        assert _records(again) == [theirs[i] for i in ORDER.tolist()]
        again.done()
    finally:
        await src.aclose()
        await storage.aclose()


async def test_a_bounded_memory_tier_serves_what_the_hint_asked_for(bucket, theirs):
    gcs, urls = bucket
    src, storage = _remote(gcs, urls, resident_bytes=6 * SEGMENT)
    try:
        await src.aopen()
        kept = src.resident
        assert kept is not None and not kept.whole
        path = BytePath(src)
        await path.serve(src.chunk_refs(np.arange(4)))  # the first read, direct
        task = np.arange(64, 128)
        refs = src.chunk_refs(task)
        alone = await path.serve(refs)  # not asked for ahead: read record by record
        assert alone.link is path.store and path.serving() is path.store

        def hint():
            kept.advise(np.unique(src.fetcher.segments_of_records(task)[0]))

        path.advise(hint)
        served = await path.serve(refs)
        assert served.link is path.memory and served.release is not None
        assert _records(served) == [theirs[i] for i in task.tolist()]
        served.done()
    finally:
        await src.aclose()
        await storage.aclose()


async def test_the_disk_tier_serves_its_segments_and_passes_the_rest_on(bucket, theirs,
                                                                        tmp_path):
    gcs, urls = bucket
    src, storage = _remote(gcs, urls)
    tier = None
    try:
        await src.aopen()
        tier = DiskTier(DiskCache(tmp_path / "c", 1 << 30), src.table, src.storage,
                        src.fetcher.segment_bytes)
        path = BytePath(src, tier)
        assert [type(link) for link in path.links] == [MemoryTier, DiskStore, Bucket]
        refs = src.chunk_refs(ORDER)
        want = [theirs[i] for i in ORDER.tolist()]
        hints = []
        path.advise(lambda: hints.append(1))
        none = await path.serve(refs)  # nothing on disk yet
        assert none.link is path.disk and tier.records_remote == len(ORDER)
        assert _records(none) == want and hints == [1]
        runs = tier.runs_of(refs)
        assert await tier.fetch_segment(int(runs[0]))  # one segment on disk: a mixed task
        mixed = await path.serve(refs)
        on_disk = int((runs == runs[0]).sum())
        assert mixed.link is path.disk and mixed.raws is not None
        assert tier.records_local == on_disk and _records(mixed) == want
        assert tier.records_remote == 2 * len(ORDER) - on_disk
        tier.start_filler(4, now=True)
        while not tier.filled:
            await asyncio.sleep(0.01)
        assert path.serving() is path.disk  # everything on disk: tasks grow as over files
        path.advise(lambda: pytest.fail("all on disk: no readahead"))
        whole = await path.serve(refs)
        assert whole.link is path.disk and whole.raws is None
        assert set(whole.refs.paths) <= set(tier.paths) and _records(whole) == want
    finally:
        if tier is not None:
            await tier.aclose()
        await src.aclose()
        await storage.aclose()
