"""Autotune: the controller's rules (properties), the resizable gate, and "auto" settings in a
running loader — chosen values visible in stats, output and states unchanged."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.io.gate import Gate
from aioloader.options import PrefetchOptions, ReadOptions, WorkerOptions
from aioloader.runtime import tuner as tuner_module
from aioloader.runtime.autotune import (
    IDLE,
    LOW_MEMORY,
    QUEUED,
    START_IO,
    START_IO_REMOTE,
    Limits,
    Observation,
    Setting,
    available_cores,
    decide,
    start,
)
from aioloader.runtime.scheduler import Scheduler
from aioloader.runtime.tuner import Sample, Tuner
from aioloader.testing import local_gcs
from aioloader.workers.executor import gate_limit

from ..support import pipeline_fns as fns

FIELDS = ("workers", "prefetch", "io_concurrency")
share = st.floats(0, 1.5, allow_nan=False)
tuned = st.frozensets(st.sampled_from(FIELDS))


@st.composite
def limits(draw) -> Limits:
    return Limits(workers=draw(st.integers(1, 64)), prefetch=draw(st.integers(1, 64)),
                  io_concurrency=draw(st.integers(1, 4096)), tune=draw(tuned))


settings_ = st.builds(Setting, st.integers(0, 100), st.integers(1, 100), st.integers(1, 5000))
observations = st.builds(Observation, share, share, share, st.floats(-4, 64), share)


def _within(s: Setting, lim: Limits) -> bool:
    return (1 <= s.workers <= lim.workers and 1 <= s.prefetch <= lim.prefetch
            and 1 <= s.io_concurrency <= lim.io_concurrency)


@given(settings_, observations, limits())
def test_decisions_stay_within_limits_and_leave_fixed_settings_alone(s, o, lim):
    nxt = decide(s, o, lim)
    for name in FIELDS:
        if name in lim.tune:
            lo = lim.min_workers if name == "workers" else 1
            assert lo <= getattr(nxt, name) <= getattr(lim, name)
        else:
            assert getattr(nxt, name) == getattr(s, name)


@given(settings_, observations, limits())
def test_workers_never_exceed_the_cores_they_were_started_with(s, o, lim):
    cores = lim.workers
    first, bounds = start("auto", "auto", "auto", cores)
    assert first.workers <= cores and bounds.workers == cores
    for _ in range(5):
        first = decide(first, o, bounds)
        assert first.workers <= cores


@given(settings_, observations, limits())
def test_nothing_grows_under_memory_pressure(s, o, lim):
    s = lim.clamp(s)
    o = Observation(o.wait_fraction, o.process_busy, o.io_busy, o.cores_free,
                    memory_free=LOW_MEMORY / 2)
    nxt = decide(s, o, lim)
    assert all(getattr(nxt, f) <= getattr(s, f) for f in FIELDS)


@given(settings_, observations, limits())
def test_a_consumer_that_does_not_wait_changes_nothing(s, o, lim):
    s = lim.clamp(s)
    o = Observation(0.0, o.process_busy, o.io_busy, o.cores_free, 1.0)
    assert decide(s, o, lim) == s


@given(settings_, observations, share, st.floats(0, 8), limits())
def test_more_waiting_or_more_free_cores_never_gives_less(s, o, more_wait, more_free, lim):
    """More free cores never give less of anything; more waiting never less prefetch or io,
    and fewer workers only where decoding is idle (the wait is elsewhere: a worker fewer
    gives its CPU to the stage that is the limit)."""
    s = lim.clamp(s)
    o = Observation(o.wait_fraction, o.process_busy, o.io_busy, o.cores_free, 1.0)
    base = decide(s, o, lim)
    freer = decide(s, dataclasses.replace(o, cores_free=o.cores_free + more_free), lim)
    assert all(getattr(freer, f) >= getattr(base, f) for f in FIELDS)
    waits = decide(s, dataclasses.replace(o, wait_fraction=o.wait_fraction + more_wait), lim)
    assert waits.prefetch >= base.prefetch and waits.io_concurrency >= base.io_concurrency
    if waits.workers < base.workers:
        assert o.process_busy * s.workers <= (s.workers - 1) * IDLE


def test_idle_workers_give_one_back_while_the_consumer_waits():
    lim = Limits(workers=4)
    waiting_on_reads = Observation(0.5, 0.1, 0.95, cores_free=0.2)
    assert decide(Setting(2, 4, 64), waiting_on_reads, lim).workers == 1
    assert decide(Setting(1, 4, 64), waiting_on_reads, lim).workers == 1  # never to 0
    busy = Observation(0.5, 0.6, 0.95, cores_free=0.2)  # 2 lanes at 0.6: 1 would be over
    assert decide(Setting(2, 4, 64), busy, lim).workers == 2
    assert decide(Setting(2, 4, 64), dataclasses.replace(waiting_on_reads, wait_fraction=0.0),
                  lim).workers == 2  # keeping up: left alone


@given(st.integers(0, 64), st.integers(1, 64))
def test_the_worker_gate_limits_lanes_only_while_some_are_to_idle(lanes, workers):
    """Fewer lanes than workers: exactly that many tasks at the pool. Every worker in use:
    one more task each, queued behind the one it runs (no idle round trip between tasks)."""
    got = gate_limit(lanes, workers)
    if lanes < workers:
        assert got == max(1, lanes)
    else:
        assert got == lanes + workers


def test_each_stage_grows_when_it_is_the_limit():
    lim = Limits(workers=4)
    s = Setting(1, 4, 64)
    cpu = decide(s, Observation(0.5, 0.95, 0.1, cores_free=2.0), lim)
    assert cpu.workers == 2
    assert decide(Setting(0, 4, 64), Observation(0.5, 0.95, 0.1, 2.0), lim).workers == 2
    assert decide(Setting(2, 4, 64), Observation(0.5, 0.95, 0.1, 2.0), lim).workers == 3
    full = decide(s, Observation(0.5, 0.95, 0.1, cores_free=0.1), lim)
    assert full == s  # decode-bound and no core: more tasks in flight would only queue
    io = decide(s, Observation(0.5, 0.2, 0.9, cores_free=1.0), lim)
    assert io == Setting(1, 5, 128)


@given(settings_, observations, st.floats(0.001, 10), st.floats(1, 100), limits())
def test_slower_reads_never_give_more_requests(s, o, floor, slower, lim):
    """Little's law: once reads take longer than the fastest seen, they queue; io grows only
    while the time per read holds (and never because reads got slower)."""
    s = lim.clamp(s)
    fast = dataclasses.replace(o, read_seconds=floor, read_floor=floor)
    slow = dataclasses.replace(o, read_seconds=floor * slower, read_floor=floor)
    assert decide(s, slow, lim).io_concurrency <= decide(s, fast, lim).io_concurrency


def test_io_doubles_only_while_reads_are_answered_as_fast_as_ever():
    lim, s = Limits(workers=4), Setting(1, 4, 256)
    io_bound = Observation(0.5, 0.2, 0.9, cores_free=1.0)
    assert decide(s, dataclasses.replace(io_bound, read_seconds=0.035, read_floor=0.031),
                  lim).io_concurrency == 512
    queued = dataclasses.replace(io_bound, read_seconds=0.031 * QUEUED * 1.1, read_floor=0.031)
    assert decide(s, queued, lim).io_concurrency == 256
    assert decide(s, io_bound, lim).io_concurrency == 512  # not timed yet: try


def test_a_bucket_starts_with_more_requests_in_flight():
    assert start("auto", "auto", "auto", 2)[0].io_concurrency == START_IO
    assert start("auto", "auto", "auto", 2, remote=True)[0].io_concurrency == START_IO_REMOTE
    assert start(0, 4, 32, 2, remote=True)[0].io_concurrency == 32  # a number is kept


def test_the_tuner_times_reads_and_keeps_the_fastest():
    applied: list = []
    t = _tuner(applied)
    a = Sample(0.0, 0.0, 0.0, 0.0, io=0.0, batches=0, reads=0)
    b = Sample(1.0, 0.5, 0.0, 0.0, io=64 * 0.04, batches=8, reads=64)  # 40 ms a read
    c = Sample(2.0, 1.0, 0.0, 0.0, io=64 * 0.04 + 64 * 0.09, batches=16, reads=128)  # 90 ms
    d = Sample(3.0, 1.5, 0.0, 0.0, io=64 * 0.13 + 0.5, batches=24, reads=138)  # 10 reads
    first = t.observe(a, b)
    assert first.read_seconds == pytest.approx(0.04) and t.read_floor == pytest.approx(0.04)
    second = t.observe(b, c)
    assert second.read_seconds == pytest.approx(0.09) and second.reads_queue()
    third = t.observe(c, d)
    assert third.read_seconds is None and t.read_floor == pytest.approx(0.04)


def test_options_take_auto_and_name_a_wrong_word():
    assert WorkerOptions(workers="auto").workers == "auto"
    assert PrefetchOptions(prefetch="auto").prefetch == "auto"
    assert ReadOptions(io_concurrency="auto").io_concurrency == "auto"
    with pytest.raises(ValueError, match="workers must be an integer or 'auto'"):
        WorkerOptions(workers="fast")
    with pytest.raises(TypeError, match="slot_size"):
        WorkerOptions(slot_size="auto")


# -- the tuner's trials (driven by hand: samples in, settings out) ------------------------


def _tuner(applied):
    stats = SimpleNamespace(elapsed=0.0)
    first, lim = start("auto", "auto", "auto", cores=2)
    # from workers=0 (where "auto" stands after a step down or a memory squeeze), so a step
    # up can be tried
    first = dataclasses.replace(first, workers=0)
    return Tuner(first, lim, stats, cores=2, apply=applied.append, memory=lambda: 1.0)


def _looks(tuner, rates, reads=None):
    """One look a second; the consumer always waits, decoding is busy, the read slots are
    full, the CPU idle; `rates` batches (and `reads` reads) are delivered in each second."""
    acc = [0.0, 0.0, 0.0, 0.0, 0, 0]
    tuner.look(Sample(0.0, *acc))
    for k, r in enumerate(rates, 1):
        s = tuner.setting
        for i, v in enumerate((0.9, 0.99 * max(1, s.workers), 0.1, 0.99 * s.io_concurrency, r,
                               reads[k - 1] if reads else 0)):
            acc[i] += v
        tuner.look(Sample(float(k), *acc))


@pytest.mark.parametrize("after, kept", [(8, False), (10, False), (14, True)])
def test_a_worker_step_that_does_not_pay_is_undone_and_not_tried_again(after, kept):
    applied: list[Setting] = []
    tuner = _tuner(applied)
    assert tuner.setting.workers == 0
    _looks(tuner, [10, after, after, after, after, after])
    workers = [s.workers for s in applied]
    assert workers[0] == 2  # tried after 8+ batches at 0 (two lanes against one)
    if kept:
        assert tuner.setting.workers == 2 and tuner.undone == 0  # (2 is all the cores)
    else:
        assert tuner.setting.workers == 0 and tuner.limits.workers == 0
        assert tuner.undone == 1 and workers.count(2) == 1  # not tried again


@pytest.mark.parametrize("gain, kept", [(1.0, False), (1.1, False), (1.3, True)])
def test_an_io_doubling_stays_only_if_it_reads_markedly_faster(gain, kept):
    """64 -> 128 doubles the reads; 128 -> 256 gives `gain`: within GAIN_IO it is noise, and
    the doubling is undone and not tried again."""
    applied: list[Setting] = []
    tuner = _tuner(applied)
    _looks(tuner, [1] * 12, reads=[1200] + [2400] * 5 + [int(2400 * gain)] * 6)
    ios = [s.io_concurrency for s in applied]
    assert ios[:2] == [128, 256]
    if kept:
        assert 128 not in ios[2:] and tuner.setting.io_concurrency >= 256
    else:
        assert ios[2] == 128
        assert tuner.limits.io_concurrency == 128 and tuner.setting.io_concurrency == 128


@pytest.mark.parametrize("after, kept", [(10, True), (9.8, True), (5, False)])
def test_a_step_down_from_idle_workers_is_kept_unless_it_costs(after, kept):
    """Workers idle while the consumer waits (reads are the limit): one fewer is tried, and
    kept when delivery holds (within the noise), else undone and not tried again."""
    applied: list[Setting] = []
    first, lim = start("auto", "auto", 64, cores=2)
    tuner = Tuner(first, lim, SimpleNamespace(elapsed=0.0), cores=2, apply=applied.append,
                  memory=lambda: 1.0)
    assert tuner.setting.workers == 2
    acc = [0.0] * 6
    tuner.look(Sample(0.0, *acc))
    for k, r in enumerate([10, 10, 10, after, after, after, after], 1):
        for i, v in enumerate((0.9, 0.1 * tuner.setting.workers, 0.1, 0.0, r, 0)):
            acc[i] += v
        tuner.look(Sample(float(k), *acc))
    workers = [s.workers for s in applied]
    assert workers[0] == 1
    if kept:
        assert tuner.setting.workers == 1 and tuner.undone == 0
    else:
        assert tuner.setting.workers == 2 and tuner.limits.min_workers == 2
        assert tuner.undone == 1 and workers.count(1) == 1


def test_no_worker_step_before_a_baseline_was_measured():
    applied: list[Setting] = []
    tuner = _tuner(applied)
    _looks(tuner, [1, 1, 1])  # fewer than MIN_BATCHES at 0 workers: prefetch/io may move
    assert all(s.workers == 0 for s in applied) and tuner.setting.prefetch > 4


# -- the gate ------------------------------------------------------------------------------


async def test_a_gate_grows_and_shrinks_while_held():
    gate = Gate(2)
    await gate.acquire()
    await gate.acquire()
    assert gate.locked()
    waiter = asyncio.ensure_future(gate.acquire())
    await asyncio.sleep(0)
    gate.resize(3)  # the waiter gets the new permit
    await asyncio.wait_for(waiter, 1)
    assert gate.held == 3
    gate.resize(1)  # three held: two releases are swallowed before a permit frees
    gate.release()
    gate.release()
    assert gate.locked()
    gate.release()
    assert not gate.locked() and gate.held == 0
    await gate.acquire()
    assert gate.locked()
    gate.release()
    assert gate.held_seconds() > 0


async def test_take_acquires_a_free_permit_at_once_and_never_jumps_the_queue():
    gate = Gate(2)
    assert gate.take() and gate.held == 1  # free: taken without awaiting
    assert gate.take() and not gate.take()  # none left
    waiter = asyncio.ensure_future(gate.acquire())
    await asyncio.sleep(0)
    gate.release()  # the permit goes to the waiter, whose turn it is
    assert not gate.take()
    await asyncio.wait_for(waiter, 1)
    gate.resize(1)  # two held, limit one: a release is swallowed
    gate.release()
    assert not gate.take() and gate.held == 1
    gate.release()
    assert gate.take() and gate.held == 1


async def test_the_scheduler_keeps_as_many_tasks_in_flight_as_its_depth_says():
    running, peaks = set(), []

    async def run(k, lo, hi):
        running.add(k)
        peaks.append(len(running))
        await asyncio.sleep(0.002)
        running.discard(k)
        return k

    sched = Scheduler(lambda lo: (lo, lo + 1) if lo < 60 else None, run, 0, depth=2)
    got = []
    for _ in range(20):
        got.append((await sched.next())[2])
    assert max(peaks) <= 2
    sched.set_depth(6)
    peaks.clear()
    for _ in range(20):
        got.append((await sched.next())[2])
    assert 2 < max(peaks) <= 6
    sched.set_depth(1)
    for _ in range(8):  # what was in flight drains first
        got.append((await sched.next())[2])
    peaks.clear()
    while (item := await sched.next()) is not None:
        got.append(item[2])
    assert max(peaks) == 1 and got == list(range(60))  # in order whatever the depth


# -- a running loader ----------------------------------------------------------------------

N = 600


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root, rng, paths = tmp_path_factory.mktemp("auto"), random.Random(0), []
    for k in range(3):
        path = root / f"train-{k}.array_record"
        with al.ArrayRecordWriter(path) as w:
            for i in range(k, N, 3):
                w.write(json.dumps({"id": i, "tokens": [rng.randrange(9)] * 5}).encode())
        paths.append(str(path))
    return paths


def _ds(paths, **kw):
    return (al.Dataset.from_arrayrecord(paths, **kw).shuffle(5).repeat(2).map(fns.decode)
            .random_map(fns.augment).map(fns.only_id_noise).batch(32))


async def _run(ds, tune=None, **kw):
    """Batches and the state after each; `tune(it, k)` is called after batch k."""
    out, states = [], []
    async with ds.loader(**kw) as it:
        async for b in it:
            out.append(b)
            states.append(it.get_state())
            if tune is not None:
                tune(it, len(out))
        return out, states, it.stats().as_dict()


_same = fns.same_batches


def _push(it, k):
    """Force the tuner's hand mid-run (what a waiting consumer with free cores would do):
    workers 0 -> 1 -> 2 (where there are 2 cores), then down under memory pressure."""
    tuner = it._parts.tuner  # (the started loader's: `runtime.parts`)
    if k in (3, 8):
        tuner.step(Observation(0.9, 0.99, 0.99, cores_free=8.0))
    if k == 15:
        tuner.step(Observation(0.9, 0.5, 0.5, cores_free=0.0, memory_free=0.01))


@pytest.fixture
def by_hand(monkeypatch):
    """Only `_push` changes settings (the tuner's own looks would make the figures vary)."""
    monkeypatch.setattr(tuner_module, "INTERVAL", 3600.0)


async def test_auto_yields_the_same_batches_and_states_as_fixed_settings(data, by_hand):
    ds = _ds(data)
    ref, ref_states, _ = await _run(ds, workers=1, prefetch=4)
    auto = dict(workers="auto", prefetch="auto", io_concurrency="auto")
    got, states, figures = await _run(ds, _push, **auto)
    _same(got, ref)
    assert states == ref_states
    tuned = figures["autotune"]
    assert tuned["tuned"] == sorted(FIELDS)
    assert [c["prefetch"] for c in tuned["changes"]][:2] == [5, 6]
    assert tuned["changes"][-1]["prefetch"] == 3  # memory pressure halved it
    workers = [c["workers"] for c in tuned["changes"]]
    c = available_cores()
    assert workers == [min(2, c), min(3, c), min(3, c) - 1]
    assert figures["workers"] == tuned["workers"] and figures["prefetch"] == 3


async def test_auto_from_a_bucket_matches_and_io_concurrency_moves(data, by_hand):
    local, _, _ = await _run(_ds(data), workers=0)
    with local_gcs(latency_ms=5, jitter_ms=2) as gcs:
        urls = [gcs.upload(p, f"a/{p.rsplit('/', 1)[1]}") for p in data]
        ds = _ds(urls, storage_options=gcs.storage_options)
        ref, ref_states, _ = await _run(ds, workers=0, io_concurrency=64, resident_bytes=0)
        got, states, figures = await _run(ds, _push, workers=0, io_concurrency="auto",
                                          resident_bytes=0)
    _same(ref, local)
    _same(got, ref)
    assert states == ref_states
    tuned = figures["autotune"]
    assert tuned["tuned"] == ["io_concurrency"] and tuned["workers"] == 0
    # a bucket starts io higher (START_IO_REMOTE), then doubles twice and halves
    assert [c["io_concurrency"] for c in tuned["changes"]] == [
        2 * START_IO_REMOTE, 4 * START_IO_REMOTE, 2 * START_IO_REMOTE]


async def test_fixed_settings_have_no_tuner(data):
    _, _, figures = await _run(_ds(data), workers=0)
    assert "autotune" not in figures


def sleepy(batch):
    """30 ms of waiting per batch: two lanes deliver twice what one does, on any load."""
    import time

    time.sleep(0.03)
    return batch


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
async def test_auto_workers_start_at_the_cores_and_a_slow_transform_keeps_them(data):
    """The worker processes start at open either way (a gate decides how many get tasks), so
    "auto" starts with all of them: ramping up from 0 cost a short run a quarter of its rate
    (benchmarks/RESULTS.md, "Autotune on a quiet machine"); growth is tested above."""
    ds = (al.Dataset.from_arrayrecord(data).repeat(4).map(fns.decode).map(fns.just_id)
          .batch(32).map(sleepy))
    _, _, figures = await _run(ds, workers="auto")
    tuned = figures["autotune"]
    assert tuned["workers"] >= 2, tuned
    assert all(c["workers"] >= 2 for c in tuned["changes"]), tuned
