"""The memory tier over the disk tier: the bounded memory tier's segment fetches (block
shuffle, sequential reads) read the disk tier's entries when there and store what they
download, so a later loader over a filled cache asks the bucket for nothing but opening the
files; a dataset kept whole in memory is filled from disk too. Counted at the emulator."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import aioloader as al
from aioloader.cache.disk import DiskCache
from aioloader.cache.tier import DiskTier
from aioloader.io.storage import Storage
from aioloader.testing import local_gcs

from ..runtime.test_pipeline import _write
from ..support import pipeline_fns as fns

N = 1500
SEGMENT = 16 << 10  # memory_budget / 4: the segment size of both tiers


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    data = _write(tmp_path_factory.mktemp("dm"), n=N, shards=4)
    with local_gcs(proxy=True) as gcs:
        urls = [gcs.upload(p, f"m/{os.path.basename(p)}") for p in data]
        yield gcs, urls, data


def _ds(paths, how, **kw):
    ds = al.Dataset.from_arrayrecord(paths, **kw)
    if how == "block":
        ds = ds.shuffle(7, strategy="block", block_bytes=3 * SEGMENT,
                        window_bytes=4 * SEGMENT)
    return ds.map(fns.decode).map(fns.just_id).batch(64)


async def _ids(ds, fill=False, **kw):
    async with ds.loader(workers=1, memory_budget=4 * SEGMENT, **kw) as it:
        batches = [b async for b in it]
        ids = [int(i) for b in batches for i in b]
        for _ in range(3000):  # the filler done (`fill`: there is one)
            cache = it.stats().as_dict()["cache"]
            if not fill or cache["disk_filled"]:
                break
            await asyncio.sleep(0.01)
        return ids, cache


def _open_cost(gcs, urls):
    """The GETs opening the files costs (tail reads within the loader's byte budget)."""
    n0 = gcs.proxy_stats.downloads
    storage = Storage(max_inflight_bytes=4 * SEGMENT, storage_options=gcs.storage_options)
    with al.ArrayRecordSource(urls, storage=storage) as src:
        len(src)
        src._sync(storage.aclose())
    return gcs.proxy_stats.downloads - n0


@pytest.mark.parametrize("how", ["block", "sequential"])
@pytest.mark.parametrize("resident", [6 * SEGMENT, 1 << 30])  # bounded; kept whole
async def test_a_filled_cache_serves_a_new_loader_without_the_bucket(bucket, tmp_path, how,
                                                                     resident):
    gcs, urls, data = bucket
    want, _ = await _ids(_ds(data, how))
    remote = _ds(urls, how, storage_options=gcs.storage_options)
    cache_dir = str(tmp_path / "c")
    got, st = await _ids(remote, resident < 1 << 30, cache_dir=cache_dir,
                         resident_bytes=resident)
    assert got == want and sorted(got) == list(range(N))
    assert st["disk_segments_read"] + st["disk_downloads"] > 0  # the memory tier's, via disk
    on_disk = [p for p in os.listdir(cache_dir) if p.endswith(".seg")]
    assert len(on_disk) == st["disk_total_segments"] > 10  # (kept whole: no filler)
    n0 = gcs.proxy_stats.downloads
    again, st2 = await _ids(remote, cache_dir=cache_dir, resident_bytes=resident)
    assert again == want
    assert gcs.proxy_stats.downloads - n0 == _open_cost(gcs, urls)  # opening, nothing more
    assert st2["disk_downloads"] == 0 and st2["disk_records_remote"] == 0


def test_memory_tier_fetches_read_the_disk_and_store_what_they_download(bucket, tmp_path):
    gcs, urls, data = bucket
    with al.ArrayRecordSource(urls, storage_options=gcs.storage_options) as src:
        table = src.table

        async def fetch_all(cache_dir):
            """Every segment through `fetch_into`, as the memory tier asks for them."""
            tier = DiskTier(DiskCache(cache_dir, 1 << 30), table, src.storage, SEGMENT)
            out = []
            try:
                for r in range(len(tier)):
                    key = tier.keys[r]
                    dest = memoryview(bytearray(key.end - key.start))
                    await tier.fetch_into(key.url, key.start, key.end, dest)
                    out.append((table.urls.index(key.url), key.start, bytes(dest)))
                # a range that is not a segment: straight from the bucket, not stored
                dest = memoryview(bytearray(10))
                await tier.fetch_into(urls[0], 1, 11, dest)
                out.append((0, 1, bytes(dest)))
                return out, tier.figures()
            finally:
                await tier.aclose()

        n0 = gcs.proxy_stats.downloads
        first, st = src._sync(fetch_all(tmp_path / "c"))
        n1 = gcs.proxy_stats.downloads
        again, st2 = src._sync(fetch_all(tmp_path / "c"))  # a new tier: a restarted job
        n2 = gcs.proxy_stats.downloads
    files = [Path(p).read_bytes() for p in data]
    for f, start, got in first:
        assert got == files[f][start : start + len(got)]
    assert again == first
    segments = st["disk_total_segments"]
    assert st["disk_downloads"] == segments and n1 - n0 == segments + 1
    assert st2["disk_downloads"] == 0 and st2["disk_segments_read"] == segments
    assert n2 - n1 == 1  # only the range that is no segment
    assert len([p for p in os.listdir(tmp_path / "c") if p.endswith(".seg")]) == segments


async def test_without_a_cache_dir_the_memory_tier_reads_the_bucket(bucket):
    gcs, urls, data = bucket
    want, _ = await _ids(_ds(data, "sequential"))
    remote = _ds(urls, "sequential", storage_options=gcs.storage_options)
    n0 = gcs.proxy_stats.downloads
    got, st = await _ids(remote, resident_bytes=6 * SEGMENT)
    assert got == want and "disk_segments_read" not in st
    assert gcs.proxy_stats.downloads - n0 > _open_cost(gcs, urls)
