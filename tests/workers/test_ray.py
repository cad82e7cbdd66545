"""The "ray" executor: tasks on Ray actors of a real local cluster give the batches the
process pool gives, resume from each other's state, survive an actor killed mid-epoch,
read a bucket's files, and leave no actor behind.

The suite's leak check is this module's own (`no_leaks_but_rays`): the cluster, started
once for the module, keeps its processes and its connections to this process (its gRPC
channels) for as long as it runs; what the executor must not leave is actors, and what any
loader must not leave (threads, shared memory, memory files, other processes, sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

ray = pytest.importorskip("ray")

import aioloader as al  # noqa: E402
from aioloader.testing import local_gcs  # noqa: E402
from aioloader.workers import raycalls  # noqa: E402
from aioloader.workers.ray import TASKS_PER_CALL, RayExecutor  # noqa: E402

from ..conftest import _snapshot  # noqa: E402
from ..support import pipeline_fns as fns  # noqa: E402
from ..support.state_fixture import digest  # noqa: E402
from . import test_executors as ex  # noqa: E402
from .test_worker_decode import batched, collect, files, filtered  # noqa: E402, F401

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.allow_leaks  # (checked here instead: `no_leaks_but_rays`)


def _ray_pids() -> set[int]:
    """The cluster's processes: this one's descendants that Ray started."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        # its workers, raylet, GCS... (not our worker server: its sys.path names ray's)
        if (line.startswith("ray::") or "/ray/" in line) and "multiprocessing" not in line:
            out.add(p.pid)
    return out


def _ray_ports() -> set[int]:
    """Ports the cluster listens on, this process's core worker among them."""
    ports = set()
    for pid in (*_ray_pids(), psutil.Process().pid):
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        ports |= {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
    return ports


def _alive_actors() -> list[str]:
    from ray._private import state  # the GCS's table (the state API needs the dashboard)

    return [a["ActorID"] for a in state.actors().values() if a["State"] != "DEAD"]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def no_leaks_but_rays(cluster):
    """The suite's leak check, less the cluster's own processes and connections; and no
    actor alive after the test."""
    before = _snapshot()
    yield
    deadline = time.monotonic() + 10.0
    while True:
        gc.collect()
        after, ports, rays = _snapshot(), _ray_ports(), _ray_pids()
        extra = {k: after[k] - before[k] for k in after}
        extra["children"] -= rays
        extra["sockets"] = {s for s in extra["sockets"]
                            if s[1].port not in ports and (not s[2] or s[2].port not in ports)}
        alive = _alive_actors()
        if (not any(extra.values()) and not alive) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    names = [t.name for t in threading.enumerate() if t.ident in extra["threads"]]
    assert not alive, f"actors left alive: {alive}"
    assert not any(extra.values()), (f"left behind: threads={names}, {extra}")


def everything(paths, **kw):
    """shuffle, map, random_map, filter, batch: every kind of step a worker runs."""
    return (al.Dataset.from_arrayrecord(paths, **kw).shuffle(7).map(fns.decode)
            .random_map(fns.augment).filter(fns.keep_even).map(fns.only_id_noise).batch(8))


@pytest.fixture(scope="module")
def ex_paths(tmp_path_factory):
    return ex._write(tmp_path_factory.mktemp("ray_executors"), n=ex.N, shards=3, group=8)


def digests(batches) -> list[str]:
    return [digest(b) for b in batches]


async def take(ds, n=None, **kw):
    """The first `n` batches (all with None) and the state after them."""
    async with ds.loader(prefetch=4, **kw) as it:
        out = []
        async for b in it:
            out.append(b)
            if len(out) == n:
                break
        return out, it.get_state(), it.stats().as_dict()


@pytest.mark.parametrize("make", [everything, batched, filtered])
async def test_the_batches_are_those_of_the_process_pool(files, make):  # noqa: F811
    ds = make(files[8])
    expected = await collect(ds, workers=2)
    got, _, stats = await take(ds, workers=2, executor="ray")
    assert digests(got) == digests(expected)
    transfers = stats["transfers"]
    tasks = transfers["in_slot"] + transfers["by_value"]
    assert transfers["actors"] == 2 and transfers["in_slot"] > 0  # (the actors are here)
    assert transfers["actor0_tasks"] + transfers["actor1_tasks"] == tasks
    assert transfers["calls"] < tasks  # tasks went grouped into calls
    # lent from their slots, or unpickled here: writable, as the other executors' are
    assert all(a.flags.writeable for b in got for a in _arrays(b))


def _arrays(tree) -> list:
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in _arrays(v)]
    if isinstance(tree, (list, tuple)):
        return [a for v in tree for a in _arrays(v)]
    return [tree] if hasattr(tree, "flags") else []


@pytest.mark.parametrize("name", ["map_random_map_batch", "filter", "flat_map", "pack", "pad",
                                  "bucket"])
def test_every_pipeline_gives_the_process_pools_bytes_through_the_slots(ex_paths, name):
    """Each of the executors' test pipelines (stream mode, packing, padding, buckets): the
    bytes of the process pool, the batches stacked in the slots by the actors on this host,
    which are given back when the loader closes."""
    ds = ex.pipelines(ex_paths)[name]
    expected = ex.sha256(ex.run(ds, workers=2))
    with ds.loader(workers=2, executor="ray", prefetch=2) as it:
        got = [b for b in it]
        transfers = it.stats().as_dict()["transfers"]
        arena = it._parts.pool.slots.arena
    assert ex.sha256(got) == expected
    assert transfers["slots_dropped"] == 0
    # (padded and bucketed batches are made here: the actors stack none)
    assert transfers["in_slot"] > 0 or name in ("pad", "bucket")
    assert arena.map is None  # (closed: the batches still held keep their own maps)


async def test_a_state_resumes_bit_for_bit_across_executors(files):  # noqa: F811
    ds = everything(files[1])
    whole = digests((await take(ds, workers=2))[0])
    head, state, _ = await take(ds, 5, workers=2)  # processes -> ray
    rest, _, _ = await take(ds, workers=2, executor="ray", state=state)
    assert digests(head + rest) == whole
    head, state, _ = await take(ds, 9, workers=1, executor=RayExecutor())  # ray -> processes
    rest, _, _ = await take(ds, workers=2, state=state)
    assert digests(head + rest) == whole


def _kill_one_actor(it) -> None:
    actors = it._parts.pool._actors
    ray.kill(actors[0])


async def test_an_actor_killed_mid_epoch_gives_the_same_batches(files, tmp_path):  # noqa: F811
    """The kill comes while the actor is running a call: the tasks are held at the actors
    (by a file that exists) until the first actor has a call, then it is killed and the
    tasks let go; whatever the machine's load, the call it ran runs again elsewhere."""
    gate = tmp_path / "held"
    ds = batched(files[1]).map(functools.partial(fns.held_while, str(gate)))
    expected = digests(await collect(ds, workers=2))
    gate.touch()
    async with ds.loader(workers=2, executor="ray", prefetch=6) as it:
        consumer = asyncio.ensure_future(_all(it))
        try:
            calls = it._parts.pool._calls
            deadline = time.monotonic() + 60
            while not calls.lines[0] and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert calls.lines[0], "the first actor never had a call"
            _kill_one_actor(it)
        finally:
            gate.unlink()
        got = await consumer
        transfers = it.stats().as_dict()["transfers"]
    assert digests(got) == expected
    assert transfers["replaced"] == 1 and transfers["reruns"] >= 1
    # the call it was running ran again in fresh slots; what it wrote was not read
    assert transfers["in_slot"] > 0 and transfers["slots_dropped"] >= 1


async def _all(it) -> list:
    return [b async for b in it]


async def test_a_call_that_cannot_be_sent_fails_its_tasks_and_none_waits(files, monkeypatch):  # noqa: F811
    """A fault in sending a grouped call (its tasks' pickling, Ray's submit) is every one of
    its tasks' error: none of them is left waiting for a result that cannot come."""
    sent = raycalls.call_args
    calls = []

    def third_fails(tasks):
        calls.append(len(tasks))
        if len(calls) == 3:
            raise OSError("the submit failed")
        return sent(tasks)

    monkeypatch.setattr(raycalls, "call_args", third_fails)
    ds = batched(files[1]).map(functools.partial(fns.nap, 0.01))
    with pytest.raises(OSError, match="the submit failed"):
        await asyncio.wait_for(collect(ds, workers=2, executor="ray"), 120)
    assert len(calls) >= 3


async def test_a_transform_that_raises_gives_the_error_the_process_pool_gives(files):  # noqa: F811
    ds = (al.Dataset.from_arrayrecord(files[1]).map(fns.decode).map(fns.fail_on_13)
          .map(fns.only_id_noise_det).batch(8))
    with pytest.raises(Exception) as pool:
        await collect(ds, workers=1)
    with pytest.raises(type(pool.value)) as actors:
        await collect(ds, workers=1, executor="ray")
    assert "thirteen is unlucky" in str(actors.value)
    assert str(actors.value) == str(pool.value)


async def test_a_task_that_takes_down_every_actor_fails_naming_it(files):  # noqa: F811
    ds = (al.Dataset.from_arrayrecord(files[1]).map(fns.decode).map(fns.crash_on_13)
          .map(fns.only_id_noise_det).batch(8))
    with pytest.raises(al.WorkerError, match=r"task \d+ .*Ray actor died 2 times"):
        await collect(ds, workers=1, executor=RayExecutor(max_reruns=1))


async def test_a_task_queued_behind_a_crash_is_not_charged_for_it(files, tmp_path):  # noqa: F811
    """One actor, one task per call: the task with record 13 takes it down while the next
    one waits behind it, then that one (record 20) takes down the new actor. Each crash is
    charged to the task that ran, once: with max_reruns=1 both run again, and the batches
    are whole."""
    def make(ids):
        crash = functools.partial(fns.crash_once_on, str(tmp_path), frozenset(ids))
        return (al.Dataset.from_arrayrecord(files[1]).map(fns.decode).map(crash)
                .map(fns.only_id_noise_det).batch(8))

    expected = digests(await collect(make(()), workers=0))
    kind = RayExecutor(max_reruns=1, tasks_per_call=1)
    got, _, stats = await take(make((13, 20)), workers=1, executor=kind)
    assert digests(got) == expected
    assert stats["transfers"]["replaced"] == 2


async def test_a_crash_in_a_grouped_call_is_charged_to_the_task_that_crashed(files):  # noqa: F811
    """Two tasks a call: when the actor dies on a record, the call's tasks run again one a
    call, so only the task that holds it is charged, and the error names its positions."""
    def make(*crash):
        ds = al.Dataset.from_arrayrecord(files[1]).map(fns.decode)
        for fn in crash:
            ds = ds.map(fn)
        return ds.map(fns.only_id_noise_det).batch(8)

    at = 45  # an output position past the first calls (those go alone, to a free actor)
    ids = [i for b in await collect(make(), workers=0) for i in fns.ids_of(b)]
    with pytest.raises(al.WorkerError, match="Ray actor died") as err:
        await collect(make(functools.partial(fns.crash_on, ids[at])), workers=1,
                      executor=RayExecutor(tasks_per_call=2))
    found = re.search(r"output positions (\d+)\.\.(\d+)", str(err.value))
    assert found is not None, str(err.value)
    lo, hi = map(int, found.groups())
    assert lo <= at <= hi, (at, str(err.value)[:80])


async def test_a_busy_actor_is_sent_whole_groups(files):  # noqa: F811
    """The runtime hands tasks over one at a time as batches are consumed; an actor with a
    call running gets the next only as a whole group, so calls carry two tasks but for
    each actor's first (idle, it takes one alone) and the tail. Slow tasks (50 ms of
    sleep, no CPU) keep the actors the bottleneck on a loaded machine too; a small slot
    keeps each task to one batch."""
    base = (al.Dataset.from_arrayrecord(files[1]).map(fns.decode).map(fns.only_id_noise_det)
            .batch(16))
    expected = digests(await collect(base, workers=0))
    ds = base.map(functools.partial(fns.nap, 0.05))
    got, _, stats = await take(ds, workers=2, executor=RayExecutor(tasks_per_call=2),
                              slot_size=8192)
    transfers = stats["transfers"]
    tasks = transfers["in_slot"] + transfers["by_value"]
    assert digests(got) == expected
    assert tasks == len(expected) and tasks / transfers["calls"] >= 1.75, transfers


async def test_tasks_sent_in_pieces_give_the_same_batches(files, monkeypatch):  # noqa: F811
    """A call's tasks go pickled in pieces under Ray's inline size (made 512 bytes here:
    most calls many pieces, the largest as they are), joined again in the actor."""
    monkeypatch.setattr(raycalls, "INLINE_BYTES", 512)
    ds = batched(files[1])
    expected = digests(await collect(ds, workers=2))
    assert digests(await collect(ds, workers=2, executor="ray")) == expected


@pytest.mark.parametrize("resident_bytes", [0, 1 << 30])  # bytes shipped / a memory copy
async def test_a_buckets_files_through_the_actors(files, resident_bytes):  # noqa: F811
    with local_gcs() as gcs:
        urls = [gcs.upload(p, f"g8/{p.rsplit('/', 1)[1]}") for p in files[8]]
        ds = everything(urls, storage_options=gcs.storage_options)
        expected = digests(await collect(ds, workers=2, resident_bytes=resident_bytes))
        got, _, stats = await take(ds, workers=2, executor="ray",
                                   resident_bytes=resident_bytes)
    assert digests(got) == expected
    if not resident_bytes:  # the bytes fetched here travel with the tasks
        assert stats["transfers"]["sent_bytes"] > 0


@pytest.mark.parametrize("resident_bytes", [None, 1 << 30])  # local files / a memory copy
async def test_actors_that_do_not_share_this_hosts_files_get_the_bytes(files,  # noqa: F811
                                                                       resident_bytes):
    """read_here=True: what actors on another node get (every actor here shares this host's
    files, so the default reads there): the chunks of local files and of a remote dataset's
    memory copy are read here and sent with the tasks, and the batches do not change."""
    with contextlib.ExitStack() as stack:
        paths = files[8]
        kw = {}
        if resident_bytes:
            gcs = stack.enter_context(local_gcs())
            paths = [gcs.upload(p, f"g8/{p.rsplit('/', 1)[1]}") for p in paths]
            kw = {"storage_options": gcs.storage_options}
        ds = everything(paths, **kw)
        opts = {} if resident_bytes is None else {"resident_bytes": resident_bytes}
        expected = digests(await collect(ds, workers=2, **opts))
        got, _, stats = await take(ds, workers=2, executor=RayExecutor(read_here=True), **opts)
    assert digests(got) == expected
    assert stats["transfers"]["sent_bytes"] > 0
    assert stats["transfers"]["in_slot"] == 0  # (by value, as from another node)
    if resident_bytes is None:  # all of them: the files' every chunk went from here
        assert stats["io"].get("worker_reads", 0) == 0


async def test_closing_kills_the_actors_of_a_users_cluster(files):  # noqa: F811
    """(The cluster stays: it is the user's.) No actor is left alive: `no_leaks_but_rays`."""
    ds = batched(files[1])
    async with ds.loader(workers=2, executor="ray", prefetch=3) as it:
        async for _ in it:
            break
        assert len(_alive_actors()) == 2
        # tasks go `TASKS_PER_CALL` to a call: that many times the tasks in flight, as many
        # calls as prefetch
        assert it._parts.run.scheduler.depth == 3 * TASKS_PER_CALL == 3 * 4
    assert ray.is_initialized() and _alive_actors() == []


OWN_CLUSTER = """
import json, sys, time
import psutil, ray
import aioloader as al
ds = al.Dataset.from_arrayrecord(sys.argv[1]).batch(50)
kind = al.RayExecutor(init_options={"num_cpus": 2})
n, started = 0, False
with ds.loader(workers=1, executor=kind) as train:  # two loaders share the one cluster
    with ds.loader(workers=1, executor=kind) as evaluate:
        n += sum(len(b) for b in evaluate)
    for b in train:  # (the cluster outlives the first to close)
        n += len(b)
        started = started or ray.is_initialized()
def rays():
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            line = " ".join(p.cmdline())
            if ((line.startswith("ray::") or "/ray/" in line) and "multiprocessing" not in line
                    and p.status() != "zombie"):
                out.append(line[:80])
        except psutil.Error:
            pass
    return out
deadline = time.monotonic() + 10  # (Ray's processes take a moment to exit)
while rays() and time.monotonic() < deadline:
    time.sleep(0.1)
from aioloader.workers import server
print(json.dumps({"server": server.server_pid(), "records": n, "started": started,
                  "still": ray.is_initialized(), "rays": rays()}))
"""


@pytest.mark.slow  # a whole cluster started and stopped: ~20-50 s on a loaded machine
def test_a_cluster_started_for_the_loaders_is_shut_down_with_the_last(files):  # noqa: F811
    out = subprocess.run([sys.executable, "-c", OWN_CLUSTER, files[1][0]], cwd=REPO,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    with al.ArrayRecordSource(files[1][0]) as src:
        assert got["records"] == 2 * len(src) and got["started"]
    assert not got["still"] and got["rays"] == []
    assert got["server"] is None  # no worker process: the process pool's server not started
    assert "SIGTERM handler is not set" not in out.stderr


async def test_a_task_cancelled_while_the_actors_start_leaves_the_executor_whole(
        files, monkeypatch):  # noqa: F811
    """A caller that gives up while the actors are still being made (a timeout, a rewind)
    does not cancel the start the other callers share: the loader goes on, and its close
    kills the actors (`no_leaks_but_rays`)."""
    from aioloader.workers import ray as ray_executor

    made, go = threading.Event(), threading.Event()
    real = ray_executor._pack_pipeline

    def slow(pipeline):  # the start held until the caller has given up
        made.set()
        go.wait(30)
        return real(pipeline)

    monkeypatch.setattr(ray_executor, "_pack_pipeline", slow)
    ds = batched(files[8])
    expected, _, _ = await take(ds, n=1, workers=0)
    async with ds.loader(workers=2, executor="ray") as it:
        s0 = it.get_state()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(it.__anext__(), 0.3)
        assert made.is_set()
        it.set_state(s0)  # (the run's tasks, all waiting on the start, are cancelled)
        await asyncio.sleep(0.2)
        go.set()
        first = await asyncio.wait_for(it.__anext__(), 60)
    assert digests([first]) == digests(expected)


@pytest.mark.parametrize("workers", [3, "auto"])
async def test_more_actors_than_the_cluster_can_place_do_not_hang_the_loader(
        files, workers):  # noqa: F811
    """The module's cluster has 2 CPUs: a third actor waits for resources and gets no
    task; workers="auto" makes no more actors than the cluster's free CPUs hold."""
    ds = batched(files[8])
    expected = await collect(ds, workers=2)
    got, _, stats = await asyncio.wait_for(take(ds, workers=workers, executor="ray"), 60)
    assert digests(got) == digests(expected)
    if workers == "auto":
        assert stats["transfers"]["actors"] <= 2


async def test_an_exact_shuffle_over_many_parquet_files_whichever_actor_runs_the_retry(
        tmp_path):
    """A task sent again with its files' contexts may go to the other actor, which lacks
    other files of it than the first did: it runs there all the same."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    for k in range(64):
        pq.write_table(pa.table({"id": np.arange(k * 10, (k + 1) * 10)}),
                       tmp_path / f"p{k:03d}.parquet", row_group_size=5)
    ds = al.Dataset.from_parquet(str(tmp_path / "p*.parquet")).shuffle(seed=0).repeat(2
                                                                                 ).batch(4)
    got = await collect(ds, workers=2, executor="ray")
    expected = await collect(ds, workers=0)
    assert [b["id"].tolist() for b in got] == [b["id"].tolist() for b in expected]


async def test_an_exact_shuffle_over_large_chunks_takes_no_spill_on_actors(
        tmp_path, monkeypatch, caplog):
    """Actors on other nodes could not open a file of this host: under the ray executor the
    horizons' fills decode per horizon (the spill is off, and the warning says why), and
    the batches are those of workers=0."""
    import logging

    from aioloader.runtime import stashchoice

    monkeypatch.setattr(stashchoice, "LARGE_CHUNK", 1)  # (chunks of ~80 KB count as large)
    path = tmp_path / "big.array_record"
    with al.ArrayRecordWriter(path, group_size=500) as w:
        for i in range(3000):
            w.write(b"%d:" % i + b"x" * (i % 300))
    ds = al.Dataset.from_arrayrecord(str(path)).shuffle(3).repeat(2).batch(64)
    want, _, _ = await take(ds, workers=0, memory_budget=400_000, spill_bytes=0)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        got, _, stats = await take(ds, workers=1, executor="ray", memory_budget=400_000)
    assert [list(b) for b in got] == [list(b) for b in want]
    assert stats["cache"]["horizons_per_epoch"] >= 2 and "spill_bytes" not in stats["cache"]
    told = [r.getMessage() for r in caplog.records if "horizons" in r.getMessage()]
    assert told and "is off: the executor's workers cannot open a file" in told[-1]
