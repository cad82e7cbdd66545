"""The pipeline end to end: determinism, resume, coverage, sharding, errors, cleanup."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import random
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.errors import CollateError, TransformError
from aioloader.testing import local_gcs
from aioloader.workers import WorkerError

from ..support import pipeline_fns as fns

N = 700


def _write(root, n=N, shards=3, group=1):
    rng = random.Random(0)
    paths = []
    for k in range(shards):
        path = root / f"train-{k:05d}-of-{shards:05d}.array_record"
        with al.ArrayRecordWriter(path, group_size=group) as w:
            for i in range(k, n, shards):
                tokens = [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
                w.write(json.dumps({"id": i, "tokens": tokens}).encode())
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("data"))


def _ids(batches):
    return [i for b in batches for i in fns.ids_of(b)]


_same = fns.same_batches


async def collect(ds, **kw):
    async with ds.loader(**kw) as it:
        return [b async for b in it]


def base(paths):
    return (al.Dataset.from_arrayrecord(paths).shuffle(7).repeat(2).map(fns.decode)
            .random_map(fns.augment).map(fns.only_id_noise).batch(32))


@pytest.mark.parametrize("workers", [1, 2])
async def test_same_batches_for_any_worker_count(data, workers):
    ds = base(data)
    ref = await collect(ds, workers=0)
    assert len(ref) == (2 * N + 31) // 32
    _same(await collect(ds, workers=workers, prefetch=3), ref)


async def test_same_batches_for_io_concurrency_and_gs_with_latency(data):
    ds = base(data)
    ref = await collect(ds, io_concurrency=64)
    _same(await collect(ds, io_concurrency=1), ref)
    with local_gcs(latency_ms=5, jitter_ms=5) as gcs:
        urls = [gcs.upload(p, f"d/{p.rsplit('/', 1)[1]}") for p in data]
        remote = (al.Dataset.from_arrayrecord(urls, storage_options=gcs.storage_options)
                  .shuffle(7).repeat(2).map(fns.decode).random_map(fns.augment)
                  .map(fns.only_id_noise).batch(32))
        _same(await collect(remote, io_concurrency=16, workers=1), ref)


async def test_epochs_cover_every_record_once_and_reshuffle(data):
    ds = (al.Dataset.from_arrayrecord(data).shuffle(3).repeat(3).map(fns.decode)
          .map(fns.only_id_noise_det).batch(100))
    ids = _ids(await collect(ds))
    epochs = [ids[e * N:(e + 1) * N] for e in range(3)]
    for e in epochs:
        assert sorted(e) == list(range(N))
    assert epochs[0] != epochs[1] != epochs[2]
    assert ids != sorted(ids)


@pytest.mark.parametrize("contiguous", [False, True])
async def test_shards_are_disjoint_and_cover(data, contiguous):
    seen = []
    for k in range(3):
        ds = (al.Dataset.from_arrayrecord(data).shuffle(1).shard(k, 3, contiguous=contiguous)
              .map(fns.decode).map(fns.only_id_noise_det).batch(64))
        seen.append(_ids(await collect(ds)))
    assert sorted(i for s in seen for i in s) == list(range(N))
    assert all(set(a).isdisjoint(b) for a in seen for b in seen if a is not b)


def test_sync_api_matches_async(data):
    ds = base(data)
    sync = list(ds.loader(workers=1))
    _same(sync, asyncio.run(collect(ds)))


async def test_filter_and_unbatched_elements(data):
    ds = al.Dataset.from_arrayrecord(data).shuffle(5).map(fns.decode).filter(fns.keep_even)
    elements = await collect(ds.map(fns.just_id))
    assert sorted(int(e) for e in elements) == list(range(0, N, 2))
    batches = await collect(ds.map(fns.only_id_noise_det).batch(50, drop_remainder=True),
                            workers=1)
    assert all(len(b["id"]) == 50 for b in batches)
    assert len(batches) == (N // 2) // 50


async def test_pack_keeps_every_token(data):
    ds = (al.Dataset.from_arrayrecord(data).map(fns.decode).map(fns.only_tokens)
          .pack({"tokens": 64}, num_packing_bins=4).batch(8))
    batches = await collect(ds)
    total = sum(int((b["tokens_segment_ids"] > 0).sum()) for b in batches)
    with al.ArrayRecordSource(data) as src:
        expected = sum(len(fns.decode(r)["tokens"]) for r in src[:])
    assert total == expected
    assert all(b["tokens"].shape[1:] == (64,) for b in batches)


PIPELINES = {
    "batch": lambda d: base(d),
    "filter": lambda d: (al.Dataset.from_arrayrecord(d).shuffle(2).repeat(2).map(fns.decode)
                         .filter(fns.keep_even).map(fns.only_id_noise_det).batch(16)),
    "pack": lambda d: (al.Dataset.from_arrayrecord(d).shuffle(4).map(fns.decode)
                       .map(fns.only_tokens).pack({"tokens": 50}, num_packing_bins=3)
                       .batch(4)),
}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(sorted(PIPELINES)), stop=st.integers(0, 60))
def test_resume_is_exact(data, kind, stop):
    ds = PIPELINES[kind](data)
    full = list(ds.loader())
    it = ds.loader(prefetch=2)
    batches = iter(it)
    head = []
    for batch in batches:
        head.append(batch)
        if len(head) >= stop:
            break
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    rest = list(ds.loader(state=state, workers=0))
    assert len(head) + len(rest) == len(full)
    _same(head + rest, full)


async def test_transform_error_names_the_record(data):
    ds = (al.Dataset.from_arrayrecord(data).map(fns.decode).map(fns.fail_on_13)
          .map(fns.only_id_noise_det).batch(10))
    for workers in (0, 1):
        with pytest.raises(TransformError,
                           match=r"fail_on_13.*unlucky on record 238 .*train-00001-of"):
            await collect(ds, workers=workers)


async def test_worker_crash_is_reported_without_hanging(data):
    ds = (al.Dataset.from_arrayrecord(data).map(fns.decode).map(fns.crash_on_13)
          .map(fns.only_id_noise_det).batch(10))
    with pytest.raises(WorkerError, match=r"worker process died.*signal 9"):
        await asyncio.wait_for(collect(ds, workers=1), 30)


@pytest.mark.parametrize("batch", [8, None])
@pytest.mark.parametrize("slot_size", [32 << 20, 16 << 10])
async def test_an_unpicklable_result_is_named_with_what_to_do(data, batch, slot_size):
    """The same error whether the batch fits its slot or goes by value (16 KiB slots: a batch
    holds 32 KiB of arrays)."""
    ds = al.Dataset.from_arrayrecord(data).map(fns.decode).map(fns.with_a_lock)
    ds = ds.batch(batch) if batch else ds
    with pytest.raises(WorkerError, match=r"task 0 .*cannot send its result back.*lock.*"
                                          r"workers=0"):
        await asyncio.wait_for(collect(ds, workers=1, slot_size=slot_size), 30)


def test_lambdas_and_closures_travel_to_workers(data):
    """Shipped by value (cloudpickle): the same records as in-process."""
    offset = 7
    ds = al.Dataset.from_arrayrecord(data).map(lambda r: len(r) + offset)
    assert list(ds.loader(workers=1)) == list(ds.loader(workers=0))


def test_a_transform_that_cannot_travel_is_refused_before_workers_start(data):
    lock = threading.Lock()

    def guarded(record):
        with lock:
            return record

    ds = al.Dataset.from_arrayrecord(data).map(guarded)
    with pytest.raises(TypeError, match=r"map\(.*guarded\) cannot be pickled.*lock.*workers=0"
                                        r".*executor=\"threads\""):
        ds.loader(workers=1)
    assert len(list(ds.loader(workers=0))) == N
    assert len(list(ds.loader(workers=2, executor="threads"))) == N  # nothing is pickled


NOTEBOOK = """
import sys, aioloader as al
def tok(record):  # defined in __main__, as in a notebook cell
    return len(record)
ds = al.Dataset.from_arrayrecord(sys.argv[1]).shuffle(3).map(tok).map(lambda n: n * 2)
got = [int(x) for x in ds.loader(workers=2)]
ref = [int(x) for x in ds.loader(workers=0)]
assert got == ref and len(got) > 0, (got[:5], ref[:5])
print("ok", len(got))
"""


def test_notebook_functions_and_lambdas_work_with_workers(data):
    """A `python -c` program (its functions live in __main__, which workers cannot import)."""
    out = subprocess.run([sys.executable, "-c", NOTEBOOK, data[0]], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok ")


def test_break_exception_and_gc_leave_nothing(data):
    ds = base(data)
    for _ in ds.loader(workers=2):
        break
    with pytest.raises(RuntimeError, match="boom"):
        for _ in ds.loader(workers=1):
            raise RuntimeError("boom")
    it = iter(ds.loader(workers=1))
    next(it)
    del it
    gc.collect()


async def test_stats_table(data):
    async with base(data).loader(workers=1) as it:
        async for _ in it:
            pass
        text = str(it.stats())
        d = it.stats().as_dict()
    assert "records/s" in text and "decode+transform" in text and "shuffle(seed=7)" in text
    assert d["records"] == 2 * N and d["batches"] == (2 * N + 31) // 32
    assert d["time_to_first_batch_s"] is not None and d["io"]["reads"] > 0


async def test_start_prefetch_overlaps(data):
    it = base(data).loader()
    it.start_prefetch()
    await asyncio.sleep(0.2)
    async with it:
        first = await it.__anext__()
    assert len(first["id"]) == 32


def test_runs_under_uvloop_and_anyio(data):
    ds = base(data)
    ref = asyncio.run(collect(ds))
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        _same(loop.run_until_complete(collect(ds, workers=1)), ref)
    finally:
        loop.close()
    anyio = pytest.importorskip("anyio")
    _same(anyio.run(collect, ds), ref)


def test_keyboard_interrupt_in_consumer_closes_everything(data):
    ds = base(data)
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(ds.loader(workers=1)):
            if i == 2:
                raise KeyboardInterrupt


@pytest.mark.parametrize("workers", [0, 1])
async def test_batches_are_lent_without_copy_and_never_overwritten(data, workers):
    """A batch comes back as views of its shared-memory slot; the slot is reused only after
    the batch is dropped, so batches a consumer keeps never change under it."""
    ds = base(data)
    ref = await collect(ds, workers=0, prefetch=1)  # reference values
    async with ds.loader(workers=workers, prefetch=2) as it:
        kept, copies = [], []
        async for k, batch in aenumerate(it):
            if k % 3 == 0:  # keep every third batch (and a copy to compare with later)
                kept.append(batch)
                copies.append({key: np.array(v) for key, v in batch.items()})
        # every kept batch is still intact after all later batches were produced
        for b, c in zip(kept, copies):
            for key in c:
                np.testing.assert_array_equal(b[key], c[key])
        _same(copies, ref[::3])
        assert any(isinstance(b["id"].base, np.ndarray) for b in kept), \
            "no batch came back as a view of its slot"
        arena = it.pool.arena
        assert not arena.idle  # the kept batches hold theirs
        del batch, kept, b
        await asyncio.sleep(0)  # done-callbacks still queued on the loop hold the last result
        gc.collect()
        assert sorted(arena.free) == list(range(arena.slots))  # all back, none twice


async def aenumerate(it):
    k = 0
    async for x in it:
        yield k, x
        k += 1


async def test_a_consumer_keeping_every_batch_never_stalls(data):
    """More batches held than the arena has slots: the rest come by value, nothing waits."""
    ds = base(data)
    ref = await collect(ds, workers=0)
    batches = await asyncio.wait_for(collect(ds, workers=1, prefetch=2), 60)
    _same(batches, ref)
    assert len(batches) > 2 + 2 + 6  # more than the slots


@pytest.mark.parametrize("batch", [64, None])
@pytest.mark.parametrize("slot_size", [32 << 20, 64 << 10])
async def test_large_non_array_payloads_come_back_through_the_slot(data, batch, slot_size):
    """Strings are not arrays: a worker pickles them into its slot (not the pipe) when they
    are larger than the pipe holds, and the parent unpickles them from there. The same
    batches and elements as workers=0, every slot back afterwards; a payload that does not
    fit the slot comes through the pipe when small (under `GROW_BYTES`), and grows the
    arena when large, then takes the slot."""
    ds = al.Dataset.from_arrayrecord(data).shuffle(5).map(fns.decode).map(fns.id_and_text)
    if batch:
        ds = ds.batch(batch)
    ref = await collect(ds, workers=0)
    async with ds.loader(workers=1, slot_size=slot_size) as it:
        await it.start()
        assert await asyncio.to_thread(it.pool.wait_started, 60)
        arena = it.pool.arena
        through_slot = []
        unpickle = arena.unpickle
        arena.unpickle = lambda ref, slot=-1: (through_slot.append(ref.size)
                                               if hasattr(ref, "size") else None) or \
            unpickle(ref, slot)
        # (copies: a consumer keeping every batch holds every slot, and the rest would come
        # by value whatever their size)
        got = [{k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in b.items()}
               async for b in it]
        if batch:
            _same(got, ref)
        else:
            assert [(int(e["id"]), e["text"]) for e in got] == \
                [(int(e["id"]), e["text"]) for e in ref]
        del got
        await asyncio.sleep(0)
        gc.collect()
        assert arena.idle
        transfers = it.stats().as_dict()["transfers"]
        grown = transfers["grown"]
    sizes = np.array(through_slot) >= 64 * 1024
    if slot_size > 1 << 20:
        assert through_slot and sizes.all()  # every task's payload (> 64 KiB) took the slot
        assert grown == 0
    else:  # more than the slot: through the pipe, unless over GROW_BYTES (the slot grows)
        assert sizes.all() and transfers["by_value"] == 0, transfers


async def test_tasks_grow_by_doubling_after_the_first_batch(data):
    """1, 2, 4... batches per task, not 1 then the goal: with one worker, a consumer that
    has its first batch must not wait for a whole large task before its second."""
    ds = (al.Dataset.from_arrayrecord(data).shuffle(3).map(fns.decode)
          .map(fns.only_id_noise_det).batch(16))
    sizes = []
    async with ds.loader(workers=1, prefetch=2) as it:
        async for _ in it:
            sizes.append(it.stats().as_dict()["batches_per_task"])
    steps = sorted(set(sizes))
    assert steps[0] in (1, 2) and steps[-1] == 8  # the goal: MAX_BATCHES_PER_TASK
    assert all(b == 2 * a for a, b in itertools.pairwise(steps))


def test_positions_are_looked_up_many_tasks_at_a_time(data, monkeypatch):
    """The permutation and the chunk table cost mostly per call: tasks of one small batch
    (no grouping: a slot holds one) still look up LOOKAHEAD_RECORDS positions a call, after
    the first (which looks up only what the first tasks need, for the first batch's sake)."""
    from aioloader.runtime import tasks

    calls = []
    lookup = tasks.TaskRunner._lookup

    def counted(self, lo, hi):
        ahead = self._ahead
        if ahead is None or not (ahead[0] <= lo and hi <= ahead[1]):
            calls.append(lo)
        return lookup(self, lo, hi)

    monkeypatch.setattr(tasks.TaskRunner, "_lookup", counted)
    monkeypatch.setattr(tasks, "LOOKAHEAD_RECORDS", 32)
    ds = al.Dataset.from_arrayrecord(data).shuffle(1).map(fns.decode).map(fns.just_id).batch(2)
    with ds.loader(workers=0, worker=al.WorkerOptions(slot_size=4096)) as it:
        got = sum(len(b) for b in it)
    assert got == N
    assert calls[0] == 0 and all(b - a >= 32 for a, b in itertools.pairwise(calls[1:])), calls


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("workers", [0, 1])
async def test_small_batches_share_tasks_without_changing_batches_or_state(data, drop, workers):
    """Small batches are grouped several to a task; batches, their order and the state after
    each one are as if every batch were its own task, and every state resumes exactly."""
    ds = (al.Dataset.from_arrayrecord(data).shuffle(3).map(fns.decode)
          .map(fns.only_id_noise_det).batch(32, drop_remainder=drop))
    batches, states = [], []
    async with ds.loader(workers=workers, prefetch=2) as it:
        async for b in it:
            batches.append({k: np.array(v) for k, v in b.items()})
            states.append(it.get_state())
        assert it.stats().as_dict()["batches_per_task"] > 1  # the grouping under test did happen
    full = N // 32 if drop else -(-N // 32)
    assert len(batches) == full
    assert [s["position"] for s in states] == [32 * (j + 1) for j in range(full)]
    ids = _ids(batches)
    assert sorted(ids) == sorted(set(ids)) and len(ids) == (full * 32 if drop else N)
    for j in (0, 4, 9, full - 2):  # resume after batch j: inside a task and at its edges
        _same(await collect(ds, workers=workers, state=states[j]), batches[j + 1:])


@pytest.mark.parametrize("fn, message", [
    (fns.missing_key_on_13, r"element to have the same keys: .*missing \[\"'x'\"\]"),
    (fns.text_on_13, r"element\['n'\] of mixed types: element 0 is int64 and element \d+ is <U8"),
])
async def test_a_batch_that_cannot_be_stacked_names_the_field_and_the_record(data, fn, message):
    ds = al.Dataset.from_arrayrecord(data).map(fns.decode).map(fn).batch(10)
    for workers in (0, 1):
        with pytest.raises(CollateError, match=message + r".*record 238 \(epoch 0\) in .*train-"):
            await collect(ds, workers=workers)
    with pytest.raises(CollateError, match=message + r".*element \d of the window at output"):
        await collect(al.Dataset.from_arrayrecord(data).map(fns.decode).map(fn)
                      .filter(fns.keep_all).batch(10))
