"""The bounded memory tier (aioloader.cache): a remote dataset larger than `resident_bytes`
is kept in part — the segments that upcoming records lie densely in, fetched ahead and
evicted once no task reads them — and the batches are the same as a local read's.

Loader tests read from the emulator over real HTTP through the delay line, which counts
requests; the store's own invariants are checked against a fake bucket.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.cache import SegmentStore, dense_segments
from aioloader.index.planning import cut_runs
from aioloader.io.memfile import shareable
from aioloader.testing import local_gcs

from ..runtime.test_pipeline import _same, _write

pytestmark = pytest.mark.skipif(not shareable(), reason="the bounded tier needs Linux memfd")

N = 3000
BATCH = 64
SEGMENT = 16 << 10  # memory_budget / 4
BUDGET = SEGMENT * 4
TIER = SEGMENT * 6  # a handful of segments; the dataset is ~40 of them


# -- which segments are dense (pure) --------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(picks=st.lists(st.integers(0, 40), max_size=80),
       rooms=st.lists(st.integers(1, 50), min_size=14, max_size=14),
       budget=st.integers(0, 300), min_count=st.integers(1, 6), by_chunk=st.booleans())
def test_dense_segments_counts_within_the_budgeted_prefix(picks, rooms, budget, min_count,
                                                          by_chunk):
    """Chunk c lies in segment c // 3; each position needs one chunk."""
    segs = [c // 3 for c in picks]
    wanted, cut = dense_segments(segs, rooms, budget, min_count,
                                 picks if by_chunk else None)
    prefix = segs[:cut]
    distinct = list(dict.fromkeys(prefix))  # first-use order
    assert sum(rooms[s] for s in distinct) <= budget
    if cut < len(segs):  # the next position's segment would not have fitted
        assert segs[cut] not in distinct
        assert sum(rooms[s] for s in distinct) + rooms[segs[cut]] > budget
    chunks = set(picks[:cut])
    count = ({s: sum(1 for c in chunks if c // 3 == s) for s in distinct} if by_chunk else
             {s: prefix.count(s) for s in distinct})
    assert wanted.tolist() == [s for s in distinct if count[s] >= min_count]


def test_dense_and_sparse_orders():
    rng = np.random.default_rng(0)
    room = np.full(1000, 4 << 20)
    sequential = np.repeat(np.arange(1000), 4096)[:200_000]
    wanted, cut = dense_segments(sequential, room, 64 << 20, 16)
    assert wanted.tolist() == list(range(16)) and cut == 16 * 4096
    exact = rng.integers(0, 1000, 200_000)  # a shuffle over 250 x the budget's segments
    wanted, cut = dense_segments(exact, room, 64 << 20, 16)
    assert wanted.size == 0 and cut < 40
    block = np.concatenate([rng.permutation(np.repeat(np.arange(w, w + 8), 4096))
                            for w in range(0, 64, 8)])  # windows of 8 segments, shuffled
    wanted, _ = dense_segments(block, room, 64 << 20, 16)
    assert sorted(wanted.tolist()) == list(range(16))
    # A block shuffle over the chunks of a large-group file: each window takes one chunk of
    # 64 records from each of many segments. Many records, one read each: not dense.
    chunk = np.repeat(rng.permutation(100_000), 64)[:200_000]  # 100 chunks a segment
    wanted, _ = dense_segments(chunk // 100, room, 64 << 20, 16, chunk)
    assert wanted.size == 0


# -- the store against a fake bucket --------------------------------------------------


def _store(sizes, chunk, segment, capacity, fetches, delay=0.0):
    f, s, e = [], [], []
    for k, size in enumerate(sizes):
        for a in range(0, size, chunk):
            f.append(k), s.append(a), e.append(min(size, a + chunk))
    runs = cut_runs(np.array(f), np.array(s), np.array(e), segment)
    blobs = [bytes(np.random.default_rng(k).integers(0, 256, n, dtype=np.uint8))
             for k, n in enumerate(sizes)]

    async def fetch(url, start, end, dest):
        fetches.append((url, start, end))
        await asyncio.sleep(delay)
        dest[:] = blobs[int(url[6:])][start:end]

    store = SegmentStore([f"mem://{k}" for k in range(len(sizes))], sizes, runs, capacity,
                         fetch)
    return store, blobs


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["advise", "task", "done"]),
                              st.lists(st.integers(0, 10**6), min_size=1, max_size=6)),
                    max_size=40))
def test_a_bounded_store_keeps_its_bounds_and_its_bytes(ops):
    """Any interleaving of readahead advice, tasks acquiring segments and tasks finishing:
    places taken stay within capacity, never overlap, a pinned segment is never evicted,
    and every resident segment holds its file's bytes."""
    fetches: list = []
    page = mmap.PAGESIZE
    store, blobs = _store([5 * page, 3 * page + 17, 7 * page], page // 2, page, 6 * page,
                          fetches, delay=0)
    assert not store.whole
    n = len(store.seg_file)

    def check(pinned):
        assert 0 <= store.live <= store.capacity
        live = sorted((int(store.loc[s]), int(store.room[s])) for s in range(n)
                      if store.loc[s] >= 0)
        assert sum(r for _, r in live) == store.live
        for (a, ra), (b, _) in itertools.pairwise(live):
            assert a + ra <= b
        for s in pinned:
            assert store._state[s] == 2  # resident while a task holds it
        for s in np.flatnonzero(store._state == 2).tolist():
            at, f = int(store.loc[s]), int(store.seg_file[s])
            a, b = int(store.seg_start[s]), int(store.seg_end[s])
            assert store.layout.mem[at : at + b - a] == blobs[f][a:b]

    async def main():
        assert store.claim()
        store.start()
        held: list[np.ndarray] = []
        for op, picks in ops:
            segs = np.unique(np.array([p % n for p in picks], dtype=np.int64))
            if op == "advise":
                store.advise(np.array(list(dict.fromkeys(p % n for p in picks)), np.int64))
            elif op == "task":
                assert await store.gate()
                if await store.acquire(segs):
                    held.append(segs)
            elif held:
                store.release(held.pop(0))
            await asyncio.sleep(0)
            check({s for h in held for s in h.tolist()})
        for h in held:
            store.release(h)
        await asyncio.sleep(0)
        check(set())
        await store.aclose()

    asyncio.run(main())


async def test_evicted_pages_go_back_and_places_are_not_reused():
    fetches: list = []
    page = mmap.PAGESIZE
    store, _ = _store([8 * page], page, page, 2 * page, fetches)
    assert store.claim()
    store.start()
    seen = set()
    for s in range(8):
        seg = np.array([s])
        store.advise(seg)
        assert await store.acquire(seg)
        assert int(store.loc[s]) not in seen  # a fresh place each fetch
        seen.add(int(store.loc[s]))
        store.release(seg)
    assert store.evictions == 6 and store.resident == 2 and store.live == 2 * page
    assert len(fetches) == 8
    # A segment readahead does not want is not fetched for a task: it reads directly.
    store.advise(np.zeros(0, np.int64))
    assert not await store.acquire(np.array([0]))
    await store.aclose()


# -- the loader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return {1: _write(tmp_path_factory.mktemp("g1"), n=N, shards=4),
            8: _write(tmp_path_factory.mktemp("g8"), n=N, shards=2, group=8),
            64: _write(tmp_path_factory.mktemp("g64"), n=N, shards=2, group=64)}


@pytest.fixture(scope="module")
def bucket(data):
    with local_gcs(proxy=True) as gcs:
        urls = {g: [gcs.upload(p, f"s{g}/{p.rsplit('/', 1)[1]}") for p in paths]
                for g, paths in data.items()}
        yield gcs, urls


async def run(ds, **kw):
    async with ds.loader(**kw) as it:
        batches = [b async for b in it]
        return batches, it.stats().as_dict(), str(it.stats())


def _pipeline(paths, order, **kw):
    ds = al.Dataset.from_arrayrecord(paths, **kw)
    if order == "block":
        ds = ds.shuffle(7, strategy="block", block_bytes=SEGMENT,
                       window_bytes=SEGMENT * 2)  # a window the tier holds
    elif order == "exact":
        ds = ds.shuffle(7)
    return ds.repeat(2).map(digest).batch(BATCH)


def digest(record: bytes) -> dict:
    """The record, byte for byte (a digest of it: records differ in length), and its id."""
    return {"id": np.int64(json.loads(record)["id"]),
            "digest": np.frombuffer(hashlib.blake2b(record, digest_size=16).digest(),
                                    np.uint8)}


@pytest.mark.parametrize(("group", "order", "workers"), [
    (1, "sequential", 0), (1, "sequential", 2), (8, "sequential", 0), (8, "sequential", 2),
    (1, "exact", 2), (64, "block", 2)])
async def test_a_dataset_larger_than_the_tier_gives_the_same_batches(data, bucket, group,
                                                                     order, workers):
    gcs, urls = bucket
    ref, _, _ = await run(_pipeline(data[group], order), workers=0)
    size = sum(gcs.list_objects(f"s{group}/").values())
    assert size >= 4 * TIER
    n0 = gcs.proxy_stats.downloads
    got, st, table = await run(_pipeline(urls[group], order,
                                         storage_options=gcs.storage_options),
                               workers=workers, memory_budget=BUDGET, resident_bytes=TIER)
    requests = gcs.proxy_stats.downloads - n0
    _same(got, ref)
    cache = st["cache"]
    if order == "exact":  # sparse: record by record, no segment fetched
        assert "tier_fetched" not in cache
        assert requests >= N
    else:  # dense (sequential, or block shuffle over whole runs): whole segments, fetched
        # ahead, evicted behind
        assert cache["tier_fetched"] > 0 and cache["tier_evictions"] > 0
        assert cache["tier_records"] > N  # most records came from memory
        assert cache["resident_bytes"] <= cache["tier_peak_bytes"] <= TIER
        assert requests < N / 4
        assert "kept in memory (in part" in table


async def test_a_tier_too_small_for_a_few_segments_is_not_used(data, bucket):
    gcs, urls = bucket
    ref, _, _ = await run(_pipeline(data[1], "sequential"), workers=0)
    got, st, _ = await run(_pipeline(urls[1], "sequential",
                                     storage_options=gcs.storage_options),
                           workers=0, memory_budget=BUDGET, resident_bytes=SEGMENT * 2)
    _same(got, ref)
    assert "resident_segments" not in st["cache"]


async def test_a_block_shuffle_the_tier_cannot_serve_says_so(data, bucket, caplog):
    """Without the memory tier a block shuffle from a bucket reads record by record (~50x
    slower): sizes too large for `resident_bytes` are refused, naming both settings; with
    the tier turned off (0), the user is told which option to raise."""
    gcs, urls = bucket
    ds = _pipeline(urls[64], "block", storage_options=gcs.storage_options)
    with pytest.raises(ValueError, match=f"raise resident_bytes to {4 * SEGMENT}") as e:
        await run(ds, workers=0, memory_budget=BUDGET, resident_bytes=SEGMENT * 2)
    assert f"window_bytes={2 * SEGMENT}" in str(e.value)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        await run(ds, workers=0, memory_budget=BUDGET, resident_bytes=0)
    said = [r.getMessage() for r in caplog.records if "block shuffle" in r.getMessage()]
    assert len(said) == 1 and "raise resident_bytes" in said[0]
    assert f"at least {4 * SEGMENT}" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        await run(ds, workers=0, memory_budget=BUDGET, resident_bytes=TIER)
    assert not [r for r in caplog.records if "block shuffle" in r.getMessage()]


@pytest.mark.parametrize("order", ["sequential", "block"])
async def test_tasks_the_tier_serves_group_batches_within_its_bounds(data, bucket, order):
    """Served from the bounded tier, tasks group several batches, as local ones do (fewer
    lookups, pins and hops per record), each within `SegmentStore.task_bytes`; the batches
    are those of a local read, and the tier stays within `resident_bytes`."""
    gcs, urls = bucket
    size = sum(gcs.list_objects("s1/").values())
    tier = size // 2  # task_bytes: size / 16, several batches of this data
    ref, _, _ = await run(_pipeline(data[1], order), workers=0)
    got, st, _ = await run(_pipeline(urls[1], order, storage_options=gcs.storage_options),
                           workers=2, memory_budget=BUDGET, resident_bytes=tier)
    _same(got, ref)
    assert st["batches_per_task"] > 1
    cache = st["cache"]
    assert cache["tier_records"] > N and cache["tier_evictions"] > 0
    assert cache["resident_bytes"] <= cache["tier_peak_bytes"] <= tier  # all along


async def test_blocks_smaller_than_segments_fetch_each_byte_once_an_epoch(data, bucket):
    """A block shuffle with blocks smaller than the tier's segments cuts the segments to the
    blocks: a segment holding parts of two blocks would be fetched once per block."""
    gcs, urls = bucket
    size = sum(gcs.list_objects("s1/").values())

    def pipeline(paths, **kw):
        return (al.Dataset.from_arrayrecord(paths, **kw)
                .shuffle(7, strategy="block", block_bytes=SEGMENT // 2,
                         window_bytes=SEGMENT * 2)
                .repeat(2).map(digest).batch(BATCH))

    ref, _, _ = await run(pipeline(data[1]), workers=0)
    got, st, _ = await run(pipeline(urls[1], storage_options=gcs.storage_options),
                           workers=2, memory_budget=BUDGET, resident_bytes=TIER)
    _same(got, ref)
    cache = st["cache"]
    # a good share of the 2N records from memory (50-65% here; how many depends on the
    # readahead racing the workers: a record not yet in is read on its own, same bytes)...
    assert cache["tier_records"] > N // 2
    # ... and each byte fetched served its record (uncut: ~3.4x the bytes per record)
    assert cache["tier_fetched_bytes"] <= 1.25 * cache["tier_records"] * size / N
    assert cache["tier_peak_bytes"] <= TIER
