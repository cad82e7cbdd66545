"""ArrayRecordSource on local files and on gs:// through the emulator over real HTTP."""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest

from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.io.storage import RetryPolicy, Storage, StorageError
from aioloader.source import ArrayRecordSource
from aioloader.testing import local_gcs

from ..support.arrayrecord_util import CODECS, make_records, write_theirs

SHARDS = 3
SHAPES = [(1, 300, 240), (64, 200, 500), (1000, 20, 2500)]  # (group, record size, records)


@pytest.fixture(scope="module")
def gcs():
    with local_gcs() as bucket:
        yield bucket


def _write_dataset(root, codec: str, group: int, size: int, count: int):
    records = make_records(size, count, seed=group)
    paths = []
    for k in range(SHARDS):
        path = root / f"{codec.replace(':', '')}-g{group}" / f"train-{k:05d}-of-{SHARDS:05d}.ar"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_theirs(path, records[k::SHARDS], f"group_size:{group},{codec}")
        paths.append(path)
    expected = [r for k in range(SHARDS) for r in records[k::SHARDS]]
    return paths, expected


@pytest.fixture(params=["local", "gs"])
def where(request, gcs):
    return request.param


def _place(where, gcs, paths):
    """The glob to open: the local files, or their uploads to the emulator."""
    if where == "local":
        return str(paths[0].parent / "train-*.ar"), {}
    prefix = f"{paths[0].parent.name}-{random.random():.6f}"
    for p in paths:
        gcs.upload(p, f"{prefix}/{p.name}")
    return gcs.url(f"{prefix}/train-*.ar"), gcs.storage_options


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("group", "size", "count"), SHAPES, ids=["g1", "g64", "g1000"])
async def test_same_records_same_order_local_and_gs(tmp_path, gcs, where, codec, group, size,
                                                    count):
    paths, expected = _write_dataset(tmp_path, codec, group, size, count)
    url, opts = _place(where, gcs, paths)
    async with ArrayRecordSource(url, storage_options=opts, verify="all") as src:
        assert len(src) == len(expected)
        assert src.urls == sorted(src.urls) and len(src.urls) == SHARDS
        rng = np.random.default_rng(0)
        order = rng.permutation(len(expected))
        got = []
        for lo in range(0, len(order), 97):
            got += await src.read(order[lo : lo + 97])
        assert got == [expected[i] for i in order]


async def test_each_chunk_fetched_and_decoded_once_per_batch(tmp_path, gcs):
    paths, expected = _write_dataset(tmp_path, "zstd:3", 1000, 20, 2500)
    url, opts = _place("gs", gcs, paths)
    async with ArrayRecordSource(url, storage_options=opts, max_gap=0) as src:
        before = src.storage.stats.reads
        idx = np.random.default_rng(1).permutation(len(src))[:500]
        assert await src.read(idx) == [expected[i] for i in idx]
        # 500 shuffled records from 3 files of 1 chunk each: 3 chunk reads, not 500.
        assert src.storage.stats.reads - before == 3
        again = await src.read(idx[:50])
        assert again == [expected[i] for i in idx[:50]]
        assert src.storage.stats.reads - before == 3  # served by the chunk cache
        assert src.cache.hits >= 3


def test_sync_api_and_index_forms(tmp_path):
    paths, expected = _write_dataset(tmp_path, "snappy", 64, 200, 500)
    with ArrayRecordSource([str(p) for p in paths]) as src:
        assert len(src) == 500
        assert src[17] == expected[17]
        assert src[-1] == expected[-1]
        assert src[[3, 1, 2]] == [expected[3], expected[1], expected[2]]
        assert src[10:20] == expected[10:20]
        assert list(src) == expected
        with pytest.raises(IndexError, match="out of range"):
            src[500]
        with pytest.raises(IndexError):
            src[[0, -7]]


async def test_open_costs_at_most_two_round_trips_per_file(tmp_path, gcs):
    paths, _ = _write_dataset(tmp_path, "zstd:3", 1, 300, 240)
    url, opts = _place("gs", gcs, paths)
    src = ArrayRecordSource(url, storage_options=opts)
    await src.aopen()
    # one listing for the glob, then one tail read per file (postscript + footer)
    assert src.storage.stats.requests == SHARDS
    await src.aclose()


async def test_footer_sidecar_cache_skips_reopen(tmp_path):
    paths, expected = _write_dataset(tmp_path, "zstd:3", 1, 300, 240)
    cache = tmp_path / "index-cache"
    async with ArrayRecordSource(paths, index_cache_dir=cache) as src:
        # Local files open by two small reads each: the postscript's head, then the footer;
        # the cache then reads the footer's head, which later opens check.
        assert src.storage.stats.requests == 3 * SHARDS
    async with ArrayRecordSource(paths, index_cache_dir=cache) as src:
        assert src.storage.stats.requests == SHARDS  # a check of each file's footer head
        assert await src.read([5, 200]) == [expected[5], expected[200]]
    # A rewritten file (new mtime/size) is not served from the stale entry.
    write_theirs(paths[0], [b"new"] * 7, "group_size:1")
    async with ArrayRecordSource(paths, index_cache_dir=cache) as src:
        assert await src.read([0]) == [b"new"]


async def test_many_concurrent_reads_through_the_delay_line(tmp_path):
    records = make_records(200, 2000, seed=5)
    path = tmp_path / "d.ar"
    write_theirs(path, records, "group_size:1")
    with local_gcs(latency_ms=100, jitter_ms=5) as slow:
        url = slow.upload(path, "d.ar")
        storage = Storage(concurrency=256, storage_options=slow.storage_options)
        async with ArrayRecordSource(url, storage=storage, max_gap=0) as src:
            idx = np.random.default_rng(2).permutation(len(records))[:1000]
            t0 = time.monotonic()
            got = await asyncio.gather(*(src.read([i]) for i in idx))
            took = time.monotonic() - t0
            assert [g[0] for g in got] == [records[i] for i in idx]
            assert storage.stats.peak_in_flight > 64
        await storage.aclose()
    # 1000 round trips one by one take >= 100 s; with 256 in flight, a few seconds
    assert took < 1000 * 0.1 / 5, took


async def test_transient_errors_are_retried_and_counted(tmp_path):
    records = make_records(300, 600, seed=6)
    path = tmp_path / "f.ar"
    write_theirs(path, records, "group_size:1")
    with local_gcs(proxy=True) as flaky:
        url = flaky.upload(path, "f.ar")
        storage = Storage(concurrency=32, storage_options=flaky.storage_options,
                          retry=RetryPolicy(base_delay=0.001, max_delay=0.01), seed=0)
        async with ArrayRecordSource(url, storage=storage, max_gap=0) as src:
            await src.aopen()
            flaky.set_faults(error_rate=0.08, statuses=(503, 503, 429))
            idx = np.random.default_rng(3).permutation(len(records))
            got = []
            for lo in range(0, len(idx), 100):
                got += await src.read(idx[lo : lo + 100])
            assert got == [records[i] for i in idx]
            assert storage.stats.retries > 0
            assert set(storage.stats.statuses) <= {"HTTP 503", "HTTP 429"}
            assert flaky.proxy_stats.faults == storage.stats.retries
        await storage.aclose()


async def test_missing_object_is_a_clear_error_at_open(gcs):
    with pytest.raises(FileNotFoundError, match=r"gs://.*/nope\.ar"):
        await ArrayRecordSource.open(gcs.url("nope.ar"), storage_options=gcs.storage_options)
    with pytest.raises(FileNotFoundError, match="no files match"):
        await ArrayRecordSource.open(gcs.url("nothing-*.ar"),
                                     storage_options=gcs.storage_options)


def test_missing_local_file_and_empty_glob(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.ar"):
        len(ArrayRecordSource(tmp_path / "missing.ar"))
    with pytest.raises(FileNotFoundError, match="no files match"):
        len(ArrayRecordSource(str(tmp_path / "*.ar")))


async def test_not_arrayrecord_object_names_the_object(gcs):
    url = gcs.upload_bytes(b"hello" * 50_000, "junk.ar")
    with pytest.raises(ArrayRecordFormatError, match=r"gs://.*junk\.ar"):
        await ArrayRecordSource.open(url, storage_options=gcs.storage_options)


async def test_object_deleted_mid_run(tmp_path, gcs):
    records = make_records(100, 300, seed=7)
    path = tmp_path / "gone.ar"
    write_theirs(path, records, "group_size:1")
    url = gcs.upload(path, "gone.ar")
    async with ArrayRecordSource(url, storage_options=gcs.storage_options) as src:
        assert await src.read([1]) == [records[1]]
        gcs.delete("gone.ar")
        with pytest.raises(FileNotFoundError, match=r"gone\.ar"):
            await asyncio.wait_for(src.read([200]), 10)


async def test_bucket_that_never_answers_hits_the_deadline(tmp_path):
    path = tmp_path / "s.ar"
    write_theirs(path, [b"x"] * 10, "group_size:1")
    with local_gcs(proxy=True) as stuck:
        url = stuck.upload(path, "s.ar")
        storage = Storage(storage_options=stuck.storage_options,
                          retry=RetryPolicy(timeout=0.3, deadline=1.0, base_delay=0.01,
                                            attempts=100))
        src = await ArrayRecordSource.open(url, storage=storage)
        stuck.set_faults(stall=True)
        t0 = time.monotonic()
        with pytest.raises(StorageError, match=r"s\.ar.*failed after \d+ attempts") as info:
            await src.read([3])
        # the deadline (1 s) ended it, not 100 attempts of 0.3 s silence each (>= 30 s)
        assert time.monotonic() - t0 < 10
        assert "no answer within 0.3 s" in str(info.value)
        stuck.set_faults(stall=False)
        await storage.aclose()
