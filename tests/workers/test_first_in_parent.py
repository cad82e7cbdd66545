"""While a pool's worker processes start, the first tasks run on a thread of this process
(`WorkerOptions.first_in_parent=True`; off by default): the first batch waits for neither the
worker server nor a worker's start. Nothing else changes: the same batches and state as
workers=0 and as a pool that waits for its workers, the same error from a transform, the
stats say where tasks ran, and a loader closed before its workers came up leaves no
process, thread or shared memory behind.

The workers are held at their start by the transforms' own module (`held_start_fns`), which
waits for a file before a worker can take a task: the test decides when they come up."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import psutil
import pytest

import aioloader as al
from aioloader.errors import TransformError

from ..runtime.test_pipeline import _write
from ..support import held_start_fns as hs
from ..support import pipeline_fns as fns
from ..support.procs import shm_files, worker_pids
from ..support.state_fixture import digest

N = 96


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("first-here"), n=N, shards=3)


@pytest.fixture
def held(tmp_path, monkeypatch):
    """The file whose creation lets this test's worker processes start."""
    gate = tmp_path / "workers-may-start"
    monkeypatch.setenv(hs.HOLD_ENV, str(gate))
    monkeypatch.setenv(hs.HOLD_PID_ENV, str(os.getpid()))
    yield gate
    gate.touch()  # (never leave a worker held)


def _pool_threads() -> list[threading.Thread]:
    """Threads of this process that a process pool's loader starts."""
    return [t for t in threading.enumerate()
            if t.name in ("aioloader-first-tasks", "aioloader-spawn", "QueueFeederThread")
            or type(t).__name__ == "_ExecutorManagerThread"]


def _sha(batches) -> str:
    return hashlib.sha256("".join(map(digest, batches)).encode()).hexdigest()


def _run(ds, state=None, **kw) -> list:
    with ds.loader(state=state, prefetch=2, **kw) as it:
        return list(it)


def test_the_first_batch_comes_while_the_workers_are_held_at_their_start(paths, held):
    ds = (al.Dataset.from_arrayrecord(paths).shuffle(2).repeat(3).map(hs.decode).map(hs.where)
          .batch(8))
    want = [b["id"].tolist() for b in _run(ds, workers=0)]
    me = os.getpid()
    with ds.loader(workers=2, prefetch=4, first_in_parent=True) as it:
        batches = iter(it)
        got = [next(batches)]  # no worker can take a task yet: it came from here
        assert got[0]["pid"].tolist() == [me] * 8
        assert not it.pool.wait_started(0)  # type: ignore[union-attr]
        assert it.stats().as_dict()["transfers"]["in_parent"] >= 1
        held.touch()
        # (till a worker is up, tasks may go on running here, one at a time; after, none)
        assert it.pool.wait_started(30)  # type: ignore[union-attr]
        got.extend(batches)
        transfers = it.stats().as_dict()["transfers"]
    assert [b["id"].tolist() for b in got] == want  # the same batches, in order
    pids = [b["pid"].tolist()[0] for b in got]
    assert any(p != me for p in pids), pids  # the workers took over once up
    # the stats count where the tasks ran: here, or back from a worker
    here = sum(p == me for p in pids)
    assert 1 <= transfers["in_parent"] <= here, (transfers, pids)
    assert transfers["in_slot"] + transfers["by_value"] >= 1, transfers


def test_the_same_bytes_and_an_exact_resume_whether_the_first_tasks_run_here(paths, held):
    ds = (al.Dataset.from_arrayrecord(paths).shuffle(5).map(fns.decode)
          .random_map(fns.augment).map(fns.only_id_noise).batch(8))
    held.touch()
    full = _run(ds, workers=0)
    assert _sha(_run(ds, workers=2, first_in_parent=True)) == _sha(full)
    assert _sha(_run(ds, workers=2, first_in_parent=False)) == _sha(full)
    # a state saved after batches made here resumes on the workers bit for bit
    held.unlink()
    it = ds.loader(workers=2, prefetch=2, first_in_parent=True)
    head = [next(iter(it))]  # (made here: the workers are held)
    assert it.stats().as_dict()["transfers"]["in_parent"] >= 1
    state = json.loads(json.dumps(it.get_state()))
    held.touch()
    it.close()
    assert _sha(head + _run(ds, state=state, workers=2)) == _sha(full)


def test_a_transform_error_in_a_first_task_is_the_one_a_worker_gives(paths, held):
    ds = al.Dataset.from_arrayrecord(paths).map(hs.decode).map(hs.fail_on_3).batch(8)
    errors = []  # first with the workers held (the first task fails here), then in a worker
    for first_in_parent in (True, False):
        if not first_in_parent:
            held.touch()
        it = ds.loader(workers=2, prefetch=2, first_in_parent=first_in_parent)
        with pytest.raises(TransformError) as info:
            for _ in it:
                pass
        held.touch()
        it.close()
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1], errors
    assert "fail_on_3" in errors[0][1] and "three" in errors[0][1]


def test_a_loader_closed_before_its_workers_came_up_leaves_nothing_behind(paths, held):
    me = psutil.Process()
    before = worker_pids(me), shm_files({me.pid}), set(_pool_threads())
    ds = al.Dataset.from_arrayrecord(paths).shuffle(1).map(hs.decode).map(hs.where).batch(8)
    it = ds.loader(workers=2, prefetch=4, first_in_parent=True)
    batches = iter(it)
    assert next(batches)["pid"].tolist() == [me.pid] * 8
    deadline = time.monotonic() + 30
    while len(worker_pids(me) - before[0]) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)  # (started, and held in their start-up)
    assert len(worker_pids(me) - before[0]) == 2 and not it.pool.wait_started(0)  # type: ignore[union-attr]
    assert set(_pool_threads()) - before[2]
    t0 = time.monotonic()
    it.close()  # the workers never come up: stopped after the grace
    took = time.monotonic() - t0
    assert took < 15, took
    deadline = time.monotonic() + 10

    def left() -> tuple:
        return (worker_pids(me) - before[0], shm_files({me.pid}) - before[1],
                set(_pool_threads()) - before[2])

    while any(left()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == (set(), set(), set())


def test_the_chunks_decoded_here_are_let_go_once_the_workers_took_over(tmp_path, held):
    """Multi-record chunks decoded by a first task stay in this process's share of the
    chunk cache only until a worker is up."""
    grouped = _write(tmp_path, n=N, shards=2, group=8)
    ds = al.Dataset.from_arrayrecord(grouped).shuffle(3).map(hs.decode).map(hs.where).batch(8)
    with ds.loader(workers=2, prefetch=2, first_in_parent=True) as it:
        batches = iter(it)
        next(batches)  # made here: the workers are held
        cache = it.pool._decoder.cache  # type: ignore[union-attr]
        assert cache.bytes > 0
        held.touch()
        assert it.pool.wait_started(30)  # type: ignore[union-attr]
        rest = list(batches)
        deadline = time.monotonic() + 10
        while cache.bytes and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cache.bytes == 0
    assert len(rest) == N // 8 - 1
