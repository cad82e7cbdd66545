"""Autotune beside a competing load: the machine's idle cores and CPU pressure in the
controller's rules (properties), the tuner's readings of them, and workers="auto" tuning the
prefetch it was not given — output unchanged."""

from __future__ import annotations

import dataclasses
import json
import random
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.options import default_prefetch
from aioloader.runtime import tuner as tuner_module
from aioloader.runtime.autotune import (
    CONTENDED,
    MAX_PREFETCH,
    Limits,
    Observation,
    Setting,
    decide,
    start,
)
from aioloader.runtime.cpuload import idle_seconds, stall_seconds
from aioloader.runtime.tuner import Sample, Tuner

from ..support import pipeline_fns as fns

FIELDS = ("workers", "prefetch", "io_concurrency")
share = st.floats(0, 1.5, allow_nan=False)


@st.composite
def limits(draw) -> Limits:
    prefetch = draw(st.integers(1, 64))
    return Limits(workers=draw(st.integers(1, 64)), prefetch=prefetch,
                  io_concurrency=draw(st.integers(1, 4096)),
                  min_prefetch=draw(st.integers(1, prefetch)),
                  tune=draw(st.frozensets(st.sampled_from(FIELDS))))


settings_ = st.builds(Setting, st.integers(0, 100), st.integers(1, 100), st.integers(1, 5000))
observations = st.builds(Observation, share, share, share, st.floats(-4, 64), share,
                         cpu_pressure=st.floats(0, 1))


@given(settings_, observations, st.floats(0, 1), limits())
def test_more_cpu_pressure_never_gives_less_prefetch_nor_more_workers(s, o, more, lim):
    """A competing load only ever deepens the queue: it never adds a worker (a worker
    more would only take its turn on the same busy cores) and never takes anything away."""
    s = lim.clamp(s)
    o = dataclasses.replace(o, memory_free=1.0)
    base = decide(s, o, lim)
    pressed = decide(s, dataclasses.replace(o, cpu_pressure=min(1.0, o.cpu_pressure + more)),
                     lim)
    assert pressed.prefetch >= base.prefetch
    assert pressed.workers == base.workers
    assert pressed.io_concurrency == base.io_concurrency


@given(settings_, observations, limits())
def test_decisions_stay_within_limits_the_prefetch_floor_included(s, o, lim):
    nxt = decide(s, o, lim)
    if "prefetch" in lim.tune:
        assert lim.min_prefetch <= nxt.prefetch <= lim.prefetch
    else:
        assert nxt.prefetch == s.prefetch


@given(settings_, observations, limits())
def test_a_consumer_that_does_not_wait_changes_nothing_under_any_pressure(s, o, lim):
    s = lim.clamp(s)
    o = dataclasses.replace(o, wait_fraction=0.0, memory_free=1.0)
    assert decide(s, o, lim) == s


@given(settings_, observations, limits())
def test_a_decision_repeated_on_the_same_figures_converges(s, o, lim):
    """Stable: the same observation over and over reaches a setting it keeps (each rule
    moves one way only, so nothing oscillates)."""
    s = lim.clamp(s)
    o = dataclasses.replace(o, memory_free=1.0)
    seen = [s]
    for _ in range(200):
        seen.append(decide(seen[-1], o, lim))
    assert seen[-1] == seen[-2]


def test_a_contended_machine_grows_the_queue_not_the_workers():
    lim = Limits(workers=2)
    s = Setting(2, 4, 64)
    starved = Observation(0.3, 0.95, 0.1, cores_free=0.0, cpu_pressure=0.6)
    got = decide(s, starved, lim)
    assert got.workers == 2 and got.prefetch == 5
    # the same without the pressure: decode-bound, no core, and tasks in flight would queue
    assert decide(s, dataclasses.replace(starved, cpu_pressure=CONTENDED / 2), lim) == s


def test_auto_workers_tune_the_prefetch_they_were_not_given():
    first, lim = start("auto", default_prefetch(2), 64, cores=2, prefetch_given=False)
    assert "prefetch" in lim.tune and first.prefetch == default_prefetch(2)
    assert lim.min_prefetch == default_prefetch(2) and lim.prefetch >= MAX_PREFETCH
    given_, lim2 = start("auto", 6, 64, cores=2, prefetch_given=True)
    assert "prefetch" not in lim2.tune and given_.prefetch == 6
    _, lim3 = start(2, default_prefetch(2), 64, cores=2, prefetch_given=False)
    assert "prefetch" not in lim3.tune  # fixed workers keep their default
    big, lim4 = start("auto", default_prefetch(64), 64, cores=64, prefetch_given=False)
    assert big.prefetch == lim4.min_prefetch == default_prefetch(64) <= lim4.prefetch


def test_the_tuner_sees_the_machine_idle_cores_and_its_pressure():
    first, lim = start("auto", "auto", 64, cores=2)
    t = Tuner(first, lim, SimpleNamespace(elapsed=0.0), cores=2, apply=lambda s: None,
              memory=lambda: 1.0)
    # this process and its workers used little, but the machine had 0.1 cores idle (a hog):
    a = Sample(0.0, 0.0, 0.0, 0.0, io=0.0, batches=0, reads=0, idle=10.0, stall=3.0)
    b = Sample(1.0, 0.3, 0.4, 0.1, io=0.0, batches=8, reads=0, idle=10.1, stall=3.7)
    o = t.observe(a, b)
    assert o.cores_free == pytest.approx(0.1)
    assert o.cpu_pressure == pytest.approx(0.7)
    # unknown (no /proc/stat, no PSI): this process's own figures, no pressure
    a2, b2 = a._replace(idle=None, stall=None), b._replace(idle=None, stall=None)
    o2 = t.observe(a2, b2)
    assert o2.cores_free == pytest.approx(2 - 0.1 - 0.2 * 2) and o2.cpu_pressure == 0.0


def test_the_machine_readings_count_up_or_are_unknown():
    for read in (idle_seconds, stall_seconds):
        x = read()
        assert x is None or x >= 0.0
        y = read()
        assert (x is None) == (y is None)
        if x is not None:
            assert y >= x


# -- a running loader ----------------------------------------------------------------------

N = 400


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root, rng, paths = tmp_path_factory.mktemp("contended"), random.Random(0), []
    for k in range(2):
        path = root / f"train-{k}.array_record"
        with al.ArrayRecordWriter(path) as w:
            for i in range(k, N, 2):
                w.write(json.dumps({"id": i, "tokens": [rng.randrange(9)] * 5}).encode())
        paths.append(str(path))
    return paths


async def _run(ds, contend=False, **kw):
    out, states = [], []
    async with ds.loader(**kw) as it:
        async for b in it:
            out.append(b)
            states.append(it.get_state())
            if contend and len(out) in (2, 5):  # what a starved, contended look decides
                it._parts.tuner.step(Observation(0.5, 0.99, 0.1, cores_free=0.0,
                                                 cpu_pressure=0.9))
        return out, states, it.stats().as_dict()


async def test_auto_workers_under_contention_yield_the_same_batches(data, monkeypatch):
    monkeypatch.setattr(tuner_module, "INTERVAL", 3600.0)  # only the forced steps move
    ds = (al.Dataset.from_arrayrecord(data).shuffle(3).map(fns.decode)
          .random_map(fns.augment).map(fns.only_id_noise).batch(16))
    ref, ref_states, _ = await _run(ds, workers=1, prefetch=4)
    got, states, figures = await _run(ds, contend=True, workers="auto")
    fns.same_batches(got, ref)
    assert states == ref_states
    tuned = figures["autotune"]
    assert tuned["tuned"] == ["prefetch", "workers"]
    start_ = figures["autotune"]["changes"][0]["prefetch"] - 1
    assert [c["prefetch"] for c in tuned["changes"]] == [start_ + 1, start_ + 2]
    assert {c["workers"] for c in tuned["changes"]} == {tuned["workers"]}
