"""Workers decode whatever the group size: files whose chunks hold many records give the same
batches as one-record chunks, locally and from a bucket, for any worker count; a task ships
and decodes each of its chunks once; bad chunks are named; every op's time is reported."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import aioloader as al
from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.arrayrecord.codecs import ZSTD
from aioloader.elements.transforms import BatchOp, FilterOp, MapOp, RandomMapOp
from aioloader.testing import local_gcs
from aioloader.workers import Pipeline, Task, open_executor
from aioloader.workers.arena import Arena
from aioloader.workers.decode import chunk_keys

from ..runtime.test_pipeline import _same, _write
from ..support import pipeline_fns as fns
from ..support.hostile import craft, grouped, simple_chunk

N = 500


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same records written with group sizes 1, 8 and 64 (three shards each)."""
    return {g: _write(tmp_path_factory.mktemp(f"g{g}"), n=N, shards=3, group=g)
            for g in (1, 8, 64)}


def batched(paths, **kw):
    return (al.Dataset.from_arrayrecord(paths, **kw).shuffle(5).repeat(2).map(fns.decode)
            .random_map(fns.augment).map(fns.only_id_noise).batch(16))


def filtered(paths, **kw):  # stream mode: the workers return elements
    return (al.Dataset.from_arrayrecord(paths, **kw).shuffle(5).map(fns.decode)
            .filter(fns.keep_even).map(fns.only_id_noise_det).batch(16))


async def collect(ds, **kw):
    async with ds.loader(**kw) as it:
        return [b async for b in it]


@pytest.mark.parametrize("group", [8, 64])
@pytest.mark.parametrize("make", [batched, filtered])
async def test_local_files_of_any_group_size_give_the_same_batches(files, group, make):
    ref = await collect(make(files[1]), workers=0)
    for workers in (0, 1, 2):
        _same(await collect(make(files[group]), workers=workers), ref)


@pytest.mark.parametrize("resident_bytes", [0, 1 << 30])  # bytes shipped / a memory copy
async def test_remote_files_of_group_size_64_give_the_same_batches(files, resident_bytes):
    ref = await collect(batched(files[1]), workers=0)
    with local_gcs() as gcs:
        urls = [gcs.upload(p, f"g64/{p.rsplit('/', 1)[1]}") for p in files[64]]
        remote = batched(urls, storage_options=gcs.storage_options)
        for workers in (0, 1, 2):
            _same(await collect(remote, workers=workers, resident_bytes=resident_bytes), ref)


async def test_block_shuffle_over_group_size_64_is_the_same_for_any_worker_count(files):
    ds = (al.Dataset.from_arrayrecord(files[64]).shuffle(3, strategy="block", block_bytes=2048,
                                                     window_bytes=8192)
          .map(fns.decode).map(fns.only_id_noise_det).batch(20))
    ref = await collect(ds, workers=0)
    assert sorted(np.concatenate([b["id"] for b in ref]).tolist()) == list(range(N))
    for workers in (1, 2):
        _same(await collect(ds, workers=workers), ref)


# -- one task: each chunk shipped once, decoded once, then kept ---------------------------


async def _task(src: al.ArrayRecordSource, indices, fetch: bool = False) -> Task:
    """A task of records `indices`, as the loader builds it (`fetch`: as for remote files)."""
    idx = np.asarray(indices, dtype=np.int64)
    refs = src.chunk_refs(idx)
    return Task(0, idx, np.zeros_like(idx), refs=refs,
                raws=await src.fetch_refs(refs) if fetch else None)


async def test_the_arena_places_a_chunk_that_records_share_once(files):
    async with al.ArrayRecordSource(files[8][0]) as src:
        task = await _task(src, [0, 9, 1, 8, 2, 16], fetch=True)  # chunks 0 1 0 1 0 2
        keys = chunk_keys(task.refs)
        arena = Arena(1, 1 << 20)
        try:
            spans = arena.place_inputs(0, task.raws, keys)
        finally:
            arena.close()
    assert spans is not None and len(set(spans)) == 3
    assert spans[0] == spans[2] == spans[4] and spans[1] == spans[3]
    sizes = {k: len(r) for k, r in zip(keys, task.raws)}
    assert sum(n for _, n in set(spans)) == sum(sizes.values())  # each copied once
    async with al.ArrayRecordSource(files[1][0]) as src:  # group size 1: nothing shared
        assert chunk_keys((await _task(src, [0, 1])).refs) is None


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("slot_size", [1 << 20, 64])  # in the slot / pickled: too big for it
@pytest.mark.parametrize("remote", [False, True])
async def test_a_task_decodes_each_chunk_once_and_the_next_finds_it_decoded(
        files, workers, slot_size, remote):
    indices = np.random.default_rng(0).permutation(64)[:40]  # of the first 8 chunks of 8
    pool = open_executor(Pipeline(record_ops=(MapOp(fns.decode), MapOp(fns.just_id)),
                                  batch=None, batch_ops=()),
                         workers, slots=2, slot_size=slot_size)
    try:
        async with al.ArrayRecordSource(files[8][0]) as src:
            want = [fns.decode(r)["id"] for r in await src.read(indices)]
            chunks = len(set(chunk_keys(src.chunk_refs(indices))))
            first = await pool.run(await _task(src, indices, remote))
            again = await pool.run(await _task(src, indices[::-1], remote))
    finally:
        pool.close()
    assert first.payload == want and again.payload == want[::-1]
    assert chunks == 8
    assert (first.chunks_decoded, first.chunk_hits) == (chunks, 0)
    assert (again.chunks_decoded, again.chunk_hits) == (0, chunks)
    if not remote:  # the worker read each chunk once, and the decoded ones not again
        assert (first.reads, again.reads) == (chunks, 0)


async def test_the_chunk_cache_is_bounded(files):
    """A cache too small for one chunk keeps none: every task decodes again."""
    pool = open_executor(Pipeline(record_ops=(), batch=None, batch_ops=(), chunk_cache_bytes=64),
                         0, slots=1)
    try:
        async with al.ArrayRecordSource(files[64][0]) as src:
            results = [await pool.run(await _task(src, range(10))) for _ in range(2)]
    finally:
        pool.close()
    assert [(r.chunks_decoded, r.chunk_hits) for r in results] == [(1, 0), (1, 0)]


async def test_where_a_task_runs_is_the_executors_choice_and_never_changes_its_result(files):
    """A pool tuned to 0 workers (`set_workers(0)`) runs tasks in this process, and at 1 in
    its worker again; with `first_in_parent` a task runs here while no worker is up. Every
    result is the same."""
    indices = np.random.default_rng(1).permutation(64)[:24]
    pipeline = Pipeline(record_ops=(MapOp(fns.decode), MapOp(fns.just_id)), batch=None,
                        batch_ops=())
    pool = open_executor(pipeline, 1, slots=2, lanes=1, first_in_parent=True)
    try:
        async with al.ArrayRecordSource(files[8][0]) as src:
            want = [fns.decode(r)["id"] for r in await src.read(indices)]
            got = [(await pool.run(await _task(src, indices))).payload]  # no worker up yet
            assert pool.figures()["in_parent"] == 1
            pool.warm_up()
            assert await asyncio.to_thread(pool.wait_started, 60)  # type: ignore[attr-defined]
            got.append((await pool.run(await _task(src, indices))).payload)  # in the worker
            pool.set_workers(0)
            assert pool.settled()
            got.append((await pool.run(await _task(src, indices))).payload)  # here
            pool.set_workers(1)
            got.append((await pool.run(await _task(src, indices))).payload)  # the worker
    finally:
        pool.close()
    assert got == [want] * 4
    assert pool.figures()["in_parent"] == 2


# -- bad chunks are named --------------------------------------------------------------------


RECORDS = [b"record %d " % i * (i + 1) for i in range(12)]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("lie", ["decoded", "count"])
async def test_a_corrupt_multi_record_chunk_names_the_file_and_the_chunk(tmp_path, workers,
                                                                          lie):
    chunks = [simple_chunk(g, ZSTD) for g in grouped(RECORDS, 3)]
    if lie == "decoded":  # the stream decodes 1,000 bytes short of what it declares
        claim = len(b"".join(grouped(RECORDS, 3)[2])) + 1000
        chunks[2] = simple_chunk(grouped(RECORDS, 3)[2], ZSTD, decoded=claim,
                                 values_prefix=claim)
        data = craft(chunks, options="group_size:3")
    else:  # the footer says chunk 2 holds 4 records, its header 3
        data = craft(chunks, options="group_size:3",
                     entries=lambda e: [x if k != 2 else (x[0], x[1], 4)
                                        for k, x in enumerate(e)])
    path = tmp_path / "bad-group.ar"
    path.write_bytes(data)
    ds = al.Dataset.from_arrayrecord(str(path), verify="all").map(len).batch(4)
    with pytest.raises(ArrayRecordFormatError) as info:
        await collect(ds, workers=workers)
    assert "bad-group.ar" in str(info.value) and "chunk 2" in str(info.value)


# -- every op is timed ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1])
async def test_each_op_reports_what_it_received_and_its_time(files, workers):
    record_ops = (MapOp(fns.decode), RandomMapOp(fns.augment, 1), FilterOp(fns.keep_even),
                  MapOp(fns.only_id_noise_det))
    pipeline = Pipeline(record_ops=record_ops, batch=BatchOp(5),
                        batch_ops=(MapOp(fns.slow_batch),))
    pool = open_executor(pipeline, workers, slots=2)
    try:
        async with al.ArrayRecordSource(files[8][0]) as src:
            kept = sum(1 for r in await src.read(range(40)) if fns.keep_even(fns.decode(r)))
            t0 = time.perf_counter()
            result = await pool.run(await _task(src, range(40)))
            wall = time.perf_counter() - t0
    finally:
        pool.close()
    batches = -(-kept // 5)
    assert result.count == kept and len(result.payload) == batches
    assert result.op_items == [40, 40, 40, kept, batches]  # record ops, then batch ops
    assert len(result.op_seconds) == 5 and min(result.op_seconds) >= 0
    assert result.op_seconds[4] >= 0.002 * batches  # the slow op is timed slow
    assert sum(result.op_seconds) <= wall
