"""A remote dataset kept in memory whole (aioloader.cache.segments): same batches, far fewer
requests.

Reads go to the emulator over real HTTP through the delay line, which counts requests.
"""

from __future__ import annotations

import asyncio
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.cache import SegmentStore
from aioloader.index.planning import cut_runs
from aioloader.io.storage import StoreUnavailableError
from aioloader.testing import local_gcs

from ..runtime.test_pipeline import _same, _write
from ..support import pipeline_fns as fns

N = 3000
BATCH = 64
SEGMENT = 16 << 10  # memory_budget / 4: many segments (runs of whole chunks)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("resident"), n=N, shards=4)


@pytest.fixture(scope="module")
def bucket(data):
    with local_gcs(proxy=True) as gcs:
        urls = [gcs.upload(p, f"r/{p.rsplit('/', 1)[1]}") for p in data]
        yield gcs, urls


def pipeline(paths, **kw):
    return (al.Dataset.from_arrayrecord(paths, **kw).shuffle(3).repeat(2).map(fns.decode)
            .random_map(fns.augment).map(fns.only_id_noise).batch(BATCH))


async def run(ds, **kw):
    async with ds.loader(**kw) as it:
        batches = [b async for b in it]
        return batches, it.stats().as_dict()


def _downloads(gcs, before):
    return gcs.proxy_stats.downloads - before


@pytest.mark.parametrize("workers", [0, 1])
async def test_same_batches_as_record_reads_with_a_fraction_of_the_requests(data, bucket,
                                                                            workers):
    gcs, urls = bucket
    ref, _ = await run(pipeline(data), workers=0)
    remote = pipeline(urls, storage_options=gcs.storage_options)
    budget = SEGMENT * 4
    n0 = gcs.proxy_stats.downloads
    per_record, io0 = await run(remote, workers=workers, memory_budget=budget,
                                resident_bytes=0)
    d0 = _downloads(gcs, n0)
    n1 = gcs.proxy_stats.downloads
    kept, st = await run(remote, workers=workers, memory_budget=budget)
    d1 = _downloads(gcs, n1)
    _same(per_record, ref)
    _same(kept, ref)
    # Every segment (a run of whole chunks) is kept, whole; the footer and postscript are
    # never read.
    with al.ArrayRecordSource(data) as src:
        runs = src.table.runs(SEGMENT)
    segments = len(runs)
    assert st["cache"]["resident_segments"] == segments
    assert st["cache"]["resident_bytes"] == int((runs.end - runs.start).sum())
    # Record by record: about one GET per record read (two epochs; a few neighbours merge).
    assert d0 >= N
    # Kept: each segment once, the first tasks' records before any segment landed, opening.
    prefetch = 4
    assert d1 <= len(urls) + segments + prefetch * BATCH
    assert d1 < d0 / 4
    assert io0["io"]["records_per_read"] < 1.2 < st["io"]["records_per_read"]


async def test_later_epochs_read_nothing(bucket):
    gcs, urls = bucket
    ds = (al.Dataset.from_arrayrecord(urls, storage_options=gcs.storage_options)
          .shuffle(5).repeat(3).batch(BATCH))
    async with ds.loader(memory_budget=SEGMENT * 4) as it:
        seen = []
        async for b in it:
            seen.append((len(b), gcs.proxy_stats.downloads))
        table = str(it.stats())
    assert "kept in memory" in table and "segments" in table
    epoch = -(-N // BATCH)
    assert len(seen) == 3 * epoch
    after_first_epoch = seen[epoch][1]
    assert seen[-1][1] == after_first_epoch  # epochs 2 and 3: no request at all


async def test_a_dataset_larger_than_resident_bytes_is_read_record_by_record(bucket):
    gcs, urls = bucket
    size = sum(gcs.list_objects("r/").values())
    ds = (al.Dataset.from_arrayrecord(urls, storage_options=gcs.storage_options)
          .shuffle(5).batch(BATCH))
    n0 = gcs.proxy_stats.downloads
    _, st = await run(ds, resident_bytes=size - 1)
    assert "resident_segments" not in st["cache"]
    assert _downloads(gcs, n0) >= N * 0.8


@pytest.mark.parametrize(("fault", "workers"), [("error_rate", 1), ("cut_rate", 0),
                                               ("cut_rate", 1)])
async def test_segment_reads_are_retried_and_the_batches_unchanged(data, fault, workers):
    """503s and 429s, or responses cut off halfway (a segment lands in place as its bytes
    arrive, so half of it is already written): read again whole, the batches unchanged."""
    ref, _ = await run(pipeline(data))
    with local_gcs(proxy=True, seed=1) as gcs:
        urls = [gcs.upload(p, f"f/{p.rsplit('/', 1)[1]}") for p in data]
        remote = pipeline(urls, storage_options=gcs.storage_options)
        gcs.set_faults(**{fault: 0.3})
        retry = al.RetryPolicy(base_delay=0.001, max_delay=0.01, attempts=30)
        got, st = await run(remote, memory_budget=SEGMENT * 4, retry=retry, workers=workers)
        stats = gcs.proxy_stats
        assert (stats.cut if fault == "cut_rate" else stats.faults) > 0
    _same(got, ref)
    assert st["io"]["retries"] > 0 and st["cache"]["resident_segments"] > 0


async def test_a_stalled_bucket_fails_with_the_segment_range_and_closes_cleanly(bucket):
    gcs, urls = bucket
    ds = (al.Dataset.from_arrayrecord(urls, storage_options=gcs.storage_options)
          .shuffle(9).batch(BATCH))
    retry = al.RetryPolicy(timeout=0.3, deadline=1.0, base_delay=0.01)
    it = ds.loader(memory_budget=SEGMENT * 4, retry=retry)
    try:
        await it.start()  # files open; the first tasks and their segment reads start
        gcs.set_faults(stall=True)
        with pytest.raises(StoreUnavailableError, match=r"r/train-.*bytes \[\d+, \d+\)"):
            async for _ in it:
                pass
    finally:
        gcs.set_faults()
        await it.aclose()


def _runs_of(sizes, chunk, segment):
    """Files of `sizes` bytes cut into chunks of `chunk` bytes, the chunks into runs."""
    f, s, e = [], [], []
    for k, size in enumerate(sizes):
        for a in range(0, size, chunk):
            f.append(k), s.append(a), e.append(min(size, a + chunk))
    return cut_runs(np.array(f, np.int64), np.array(s, np.int64), np.array(e, np.int64),
                    segment), list(zip(f, s, e))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    chunk=st.integers(1, 40),
    segment=st.integers(1, 64),
    picks=st.lists(st.integers(0, 10**6), max_size=30),
)
def test_views_are_the_bytes_asked_for(sizes, chunk, segment, picks):
    """Any chunks, any segment size: within one segment, at file ends, chunks larger than
    a segment."""
    blobs = [bytes(np.random.default_rng(k).integers(0, 256, s, dtype=np.uint8))
             for k, s in enumerate(sizes)]
    urls = [f"mem://{k}" for k in range(len(sizes))]
    runs, chunks = _runs_of(sizes, chunk, segment)
    reads = []

    async def read_into(url, start, end, dest):
        reads.append((url, start, end))
        await asyncio.sleep(0)
        dest[:] = blobs[int(url[6:])][start:end]

    ranges = [chunks[p % len(chunks)] for p in picks] if chunks else []

    async def main():
        kept = SegmentStore(urls, sizes, runs, sum(sizes) + 1, read_into)
        assert kept.whole
        files, starts, ends = (np.array(x, dtype=np.int64).reshape(-1)
                               for x in zip(*ranges)) if ranges else [np.zeros(0, np.int64)] * 3
        segs = kept.segments_of(files, starts, ends)
        assert segs is not None
        assert kept.claim()  # the first read goes direct
        assert not kept.claim() and not reads  # ... once, and fetches no segment

        async def later():
            assert await kept.gate()
            return await kept.views(segs, starts, ends)

        waiting = asyncio.ensure_future(later())
        await asyncio.sleep(0.01)
        assert not waiting.done() and not reads  # the next waits for the first to end
        kept.start(segs[:1])
        got = await waiting
        assert [bytes(v) for v in got] == [blobs[f][s:e] for f, s, e in ranges]
        assert len(reads) == len(set(reads))  # each segment fetched once, whole
        runs_read = set(zip([urls[f] for f in runs.file.tolist()], runs.start.tolist(),
                            runs.end.tolist()))
        assert set(reads) <= runs_read
        await kept.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("workers", [0, 1])
async def test_a_damaged_chunk_read_from_memory_names_the_object(tmp_path, workers):
    """Past the first batch, workers read the in-memory copy; errors still name the object
    in the bucket (not the memory file), its chunk, and what to do."""
    from aioloader.arrayrecord import ArrayRecordFormatError

    from ..source.test_reliability_input import _corrupt_chunk_header

    paths = _write(tmp_path, n=400, shards=2)
    _corrupt_chunk_header(paths[1], chunk=150)  # far from the first batch (no shuffle)
    with local_gcs() as gcs:
        urls = [gcs.upload(p, f"bad-{workers}/{p.rsplit('/', 1)[1]}") for p in paths]
        ds = (al.Dataset.from_arrayrecord(urls, storage_options=gcs.storage_options)
              .batch(16))
        with pytest.raises(ArrayRecordFormatError, match=r"chunk 150.*header hash") as info:
            await run(ds, workers=workers)
    msg = str(info.value)
    assert f"gs://{gcs.bucket}/bad-{workers}/train-00001-of-00002" in msg
    assert "/proc/" not in msg and "re-create or re-upload" in msg


def test_one_descriptor_however_many_files():
    """2,000 small files kept in memory hold one memory file, not a descriptor each
    (a typical limit is 1,024 open files; every worker would hold them too)."""
    import psutil

    me = psutil.Process()
    before = me.num_fds()
    sizes = [1000 + k for k in range(2000)]

    async def read_into(url, start, end, dest):
        dest[:] = bytes(end - start)

    runs, _ = _runs_of(sizes, 4096, 4096)
    kept = SegmentStore([f"mem://{k}" for k in range(2000)], sizes, runs, 1 << 30, read_into)
    try:
        assert me.num_fds() - before <= 2  # the memory file, and the dup mmap keeps
        assert (kept.loc % mmap.PAGESIZE == 0).all() and kept.loc[-1] + 1000 >= sum(sizes)
    finally:
        asyncio.run(kept.aclose())
    assert me.num_fds() == before


@pytest.mark.skipif(not hasattr(__import__("os"), "memfd_create"), reason="Linux memfd")
def test_workers_read_the_memory_copy_through_a_map(data):
    """A worker maps the memory copy and slices records out of it (no read call per record):
    the same bytes as reading the files; a range past the copy names the original file;
    closing lets go of the map even while records still view it."""
    import os

    from aioloader.source import ArrayRecordSource
    from aioloader.workers import LocalFiles

    with ArrayRecordSource(data) as src:
        refs = src.chunk_refs(np.random.default_rng(0).permutation(len(src))[:500])
    fd = os.memfd_create("test-copy")
    try:
        shift, at = [], mmap.PAGESIZE  # not at 0: the shift must be applied
        for p in refs.paths:
            with open(p, "rb") as f:
                blob = f.read()
            os.pwrite(fd, blob, at)
            shift.append(at)
            at += -(-len(blob) // mmap.PAGESIZE) * mmap.PAGESIZE
        copy = refs.read_from([f"/proc/{os.getpid()}/fd/{fd}"] * len(refs.paths), shift)
        files = LocalFiles()
        try:
            got = files.read(copy)
            assert all(isinstance(r, memoryview) for r in got)
            assert [bytes(r) for r in got] == LocalFiles().read(refs)
            past = copy.read_from(copy.paths, [at] * len(copy.paths))  # beyond the copy's end
            with pytest.raises(Exception, match=refs.paths[int(refs.file[0])].rsplit("/")[-1]):
                files.read(past)
        finally:
            files.close()  # `got` still views the map: it goes when they do
        assert bytes(got[0]) == LocalFiles().read(refs)[0]
    finally:
        os.close(fd)


async def test_closing_cancels_fetches_and_refuses_later_reads(bucket):
    """A source read after closing reads record by record (the memory copy is gone); a
    reader waiting on segments when the copy closes gets an error, not a hang, and no
    fetch outlives the close."""
    from aioloader.io.storage import StorageError
    from aioloader.source import ArrayRecordSource

    gcs, urls = bucket
    src = ArrayRecordSource(urls, storage_options=gcs.storage_options, resident_bytes=1 << 30)
    async with src:
        want = await src.read(list(range(0, N, 7)))
        await src.read(list(range(3, N, 11)))  # the second read: from segments
        kept = src.resident
        assert kept is not None and kept.resident > 0
    assert src.resident is None
    n0 = gcs.proxy_stats.downloads
    assert await src.read(list(range(0, N, 7))) == want  # record by record now
    assert _downloads(gcs, n0) > 0
    await src.aclose()
    with pytest.raises(StorageError, match="closed: open the source again"):
        await kept.gate()

    gate = asyncio.Event()

    async def slow_read_into(url, start, end, dest):
        await gate.wait()  # never set: the fetch is still running at close
        dest[:] = bytes(end - start)

    runs, _ = _runs_of([1000], 500, 100)
    other = SegmentStore(["mem://a"], [1000], runs, 1 << 20, slow_read_into)
    one = (np.array([0]), np.array([0]), np.array([500]))
    assert other.claim()  # the first read goes direct
    other.start(other.segments_of(*one))
    waiting = asyncio.ensure_future(other.views(other.segments_of(*one), *one[1:]))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await other.aclose()
    with pytest.raises(StorageError):
        await waiting
    assert not other._fetching and other.bytes == 0
