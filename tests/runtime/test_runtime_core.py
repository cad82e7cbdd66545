"""The runtime's pure parts without files or processes: `plan`, `LoaderState`, `Scheduler`."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.describe.plan import DEFAULT_WINDOW, MAX_BATCHES_PER_TASK, SourceMeta, compile, shape
from aioloader.describe.state import LoaderState, StateError
from aioloader.index.sampling import Shard
from aioloader.options import LoaderOptions, WorkerOptions
from aioloader.runtime.parts import worker_pipeline
from aioloader.runtime.scheduler import Scheduler
from aioloader.urls import redact

from ..support import pipeline_fns as fns

DS = al.Dataset.from_arrayrecord("/data/train-*.array_record")


def _meta(n: int, local: bool = True) -> SourceMeta:
    return SourceMeta(n, np.arange(n + 1, dtype=np.int64), local, False)


# -- plan --------------------------------------------------------------------------------


def test_the_mode_and_unit_follow_the_description():
    batch = shape(DS.map(fns.decode).batch(32))
    assert batch.batch_mode and batch.unit == 32 and not batch.drop_remainder
    filtered = shape(DS.map(fns.decode).filter(fns.keep_even).batch(32))
    assert not filtered.batch_mode and filtered.unit == 32  # windows of the batch size
    packed = shape(DS.map(fns.decode).pack({"tokens": 8}, num_packing_bins=2))
    assert not packed.batch_mode and packed.unit == DEFAULT_WINDOW
    assert shape(DS.map(fns.decode), window=100).unit == 100
    assert shape(DS.batch(8, drop_remainder=True)).drop_remainder


def test_process_sharding_resolves_to_a_block_dealt_shard_and_a_global_fingerprint():
    ds = DS.shuffle(3).shard_by_jax_process().batch(8)
    plan = compile(ds, _meta(100), LoaderOptions(), procs=(1, 4))
    shard = plan.index.ops[-1]
    assert isinstance(shard, Shard) and (shard.index, shard.count, shard.block) == (1, 4, 8)
    assert "batch(global 32)" in plan.shape.fingerprint
    assert plan.shape.process_count == 4
    alone = compile(DS.batch(8), _meta(100), LoaderOptions(), procs=(1, 4))
    assert alone.shape.procs is None  # no shard_by_jax_process(): one process's view


def test_the_worker_pipeline_batches_only_in_batch_mode():
    ds = DS.map(fns.decode).batch(4).map(fns.ids_of)
    pipeline = worker_pipeline(ds, shape(ds), "none", 1 << 20)
    assert pipeline.batch is not None and len(pipeline.batch_ops) == 1
    assert len(compile(ds, _meta(10), LoaderOptions()).batch_ops) == 1
    ds = DS.map(fns.decode).filter(fns.keep_even).batch(4)
    pipeline = worker_pipeline(ds, shape(ds), "none", 1 << 20)
    assert pipeline.batch is None and len(pipeline.record_ops) == 2
    plan = compile(ds, _meta(10), LoaderOptions())
    assert plan.batch_ops == () and len(plan.record_ops) == 2


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), size=st.integers(1, 40), drop=st.booleans(),
       per_task=st.integers(1, 8), start_batches=st.integers(0, 20))
def test_task_spans_tile_the_stream_in_whole_batches(n, size, drop, per_task, start_batches):
    plan = compile(DS.batch(size, drop_remainder=drop), _meta(n), LoaderOptions())
    lo = min(start_batches * size, n)
    spans = []
    while (span := plan.span(lo, per_task)) is not None:
        spans.append(span)
        lo = span[1]
    covered = [p for a, b in spans for p in range(a, b)]
    start = min(start_batches * size, n)
    end = start + (n - start) // size * size if drop else n
    assert covered == list(range(start, end))
    assert all((a % size == 0 and (b - a) % size == 0) or b == n for a, b in spans)
    assert plan.batches_from(start) == -(-(end - start) // size)


def test_small_local_batches_may_share_a_task_remote_ones_do_not():
    local = compile(DS.batch(16), _meta(1000, local=True), LoaderOptions())
    assert local.task_size_goal(16 * 8) == MAX_BATCHES_PER_TASK
    assert local.task_size_goal(30 << 20) == 1  # two would not fit a 32 MiB slot
    remote = compile(DS.batch(16), _meta(1000, local=False), LoaderOptions())
    assert remote.task_size_goal(16 * 8) == 1
    small_slots = compile(DS.batch(16), _meta(1000),
                          LoaderOptions(worker=WorkerOptions(slot_size=64 << 10)))
    assert small_slots.task_size_goal(4 << 10) == 4  # half the slot: room for larger ones
    assert small_slots.task_size_goal(16 << 10) == 1


def test_batches_of_256_small_records_go_eight_to_a_task():
    """A task's fixed cost (planning, the process hop, the result's hand-over) amortizes over
    the records it covers: batches of 256 small records group to MAX_BATCHES_PER_TASK."""
    local = compile(DS.batch(256), _meta(100_000, local=True), LoaderOptions())
    assert local.task_size_goal(256 * 1024) == MAX_BATCHES_PER_TASK
    assert local.task_size_goal(16 << 20) == 1  # two would not fit a 32 MiB slot


# -- LoaderState ---------------------------------------------------------------------------

PIPE = ("source(x)", "batch(8)")


@given(pos=st.integers(0, 2**40), skip=st.integers(0, 1000), rows=st.integers(0, 100),
       unit=st.integers(1, 4096), procs=st.integers(1, 64))
def test_a_state_round_trips_through_json(pos, skip, rows, unit, procs):
    s = LoaderState(pos, skip, rows, unit, procs, PIPE)
    assert LoaderState.from_json(s.to_json()) == s
    assert list(s.to_json()) == ["version", "position", "skip", "rows", "unit",
                                 "process_count", "pipeline"]


@given(steps=st.integers(0, 1000), unit=st.integers(1, 64), old=st.integers(1, 16),
       new=st.integers(1, 16))
def test_elastic_resume_keeps_the_global_step(steps, unit, old, new):
    """Saved on `old` processes with a local batch of `unit`, resumed on `new` with the same
    global batch: the same number of global steps were taken."""
    global_batch = unit * old
    if global_batch % new:
        return
    local = global_batch // new
    s = LoaderState(steps * unit, 0, 0, unit, old, PIPE)
    moved = s.resume_as(PIPE, local, new, batch_mode=True)
    assert moved.position == steps * local and moved.unit == local
    assert moved.process_count == new


def test_resume_refuses_what_cannot_carry_over():
    s = LoaderState(16, 0, 0, 8, 2, PIPE)
    with pytest.raises(StateError, match="different pipeline"):
        s.resume_as(("source(y)", "batch(8)"), 8, 2, True)
    with pytest.raises(StateError, match="same global batch size"):
        s.resume_as(PIPE, 8, 4, True)  # global 16 -> 32
    with pytest.raises(StateError, match="batch size 8, not 4"):
        s.resume_as(PIPE, 4, 2, True)
    with pytest.raises(StateError, match="merge_states"):
        s.resume_as(PIPE, 8, 1, batch_mode=False)
    with pytest.raises(StateError, match="not on a batch boundary"):
        LoaderState(12, 0, 0, 8, 2, PIPE).resume_as(PIPE, 16, 1, True)
    stream = LoaderState(256, 3, 0, 256, 1, PIPE).resume_as(PIPE, 32, 1, batch_mode=False)
    assert stream.unit == 256  # a stream keeps the window it was saved with


def test_a_signed_url_signed_again_still_resumes():
    saved = LoaderState(8, 0, 0, 8, 1, ("source(gs://b/x?X-Goog-Signature=abc)", "batch(8)"))
    now = (redact("source(gs://b/x?X-Goog-Signature=def)"), "batch(8)")  # as describe() says
    assert saved.resume_as(now, 8, 1, True).position == 8


# -- Scheduler -----------------------------------------------------------------------------


def _spans(n: int, size: int):
    return lambda lo: (lo, min(lo + size, n)) if lo < n else None


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 60), size=st.integers(1, 7), depth=st.integers(1, 6),
       seed=st.integers(0, 1000))
def test_results_come_in_task_order_whatever_finishes_first(n, size, depth, seed):
    rng = random.Random(seed)
    in_flight, peak = [0], [0]

    async def run(k, lo, hi):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(rng.random() * 0.002)
        in_flight[0] -= 1
        return k, list(range(lo, hi))

    async def main():
        s = Scheduler(_spans(n, size), run, 0, depth)
        out = []
        while (item := await s.next()) is not None:
            out.append(item)
        await s.aclose()
        return out

    out = asyncio.run(main())
    assert [k for _, _, (k, _) in out] == list(range(len(out)))
    assert [p for _, _, (_, ps) in out for p in ps] == list(range(n))
    assert peak[0] <= depth


def test_an_error_is_raised_in_its_turn_and_close_cancels_the_rest():
    started, cancelled = [], []

    async def run(k, lo, hi):
        started.append(k)
        if k == 2:
            raise ValueError("task 2 failed")
        try:
            await asyncio.sleep(0 if k < 2 else 10)
        except asyncio.CancelledError:
            cancelled.append(k)
            raise
        return k

    async def main():
        s = Scheduler(_spans(100, 1), run, 0, 4)
        assert (await s.next())[2] == 0
        assert (await s.next())[2] == 1
        with pytest.raises(ValueError, match="task 2 failed"):
            await s.next()
        await s.aclose()

    asyncio.run(main())
    assert max(started) < 2 + 4 + 1  # never more than `depth` ahead of the consumer
    assert cancelled and all(k > 2 for k in cancelled)


def test_spans_are_asked_for_only_when_there_is_room():
    """The task size may grow between tasks: a span is computed when its task can start."""
    asked = []

    def span(lo):
        asked.append(lo)
        return (lo, lo + 1) if lo < 10 else None

    async def run(k, lo, hi):
        return lo

    async def main():
        s = Scheduler(span, run, 0, 2)
        await asyncio.sleep(0.01)
        before = len(asked)
        got = [(await s.next())[2] for _ in range(10)]
        assert await s.next() is None
        await s.aclose()
        return before, got

    before, got = asyncio.run(main())
    assert before == 2 and got == list(range(10))  # two running; the third waits for room
