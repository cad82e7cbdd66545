"""Reliability under faults: a flaky bucket, a dead bucket, killed trainers and workers, exits.

Every fault is real: HTTP errors, connection resets and slow bodies come from the delay line
in front of fake-gcs-server (`aioloader.testing`), processes die by SIGKILL or SIGSEGV, and
the training process of the checkpoint test is a separate interpreter
(`tests/support/reliability_child.py`). What must hold: the batches are exactly those of a
fault-free run, every injected fault is accounted for, errors are clear and quick, nothing
hangs, and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import aioloader as al
from aioloader.io.storage import gcs_client_for
from aioloader.testing import ProxyStats, local_gcs

from ..support import reliability_child as rc
from ..support.procs import is_stdlib_helper, memory_files, worker_pids

CHILD = Path(__file__).parents[1] / "support" / "reliability_child.py"
REPO = Path(__file__).resolve().parents[2]
BIG_N, BIG_SHARDS = 10_500, 12  # a shuffled epoch with max_gap=0: > 10,000 range requests
SMALL_N, SMALL_SHARDS = 3_000, 4

# The flaky bucket: 1% 503, 0.5% 429, 0.3% connection resets, 0.5% of bodies 0.3 s late.
FLAKY = {"error_rate": 0.015, "statuses": (503, 503, 429), "reset_rate": 0.003,
         "slow_rate": 0.005, "slow_s": 0.3}
# Exact accounting needs every download to be one loader attempt, whatever the machine's load:
# no hedges, and no attempt cut short (a request given up on before the proxy has parsed it
# is an attempt the proxy never saw). Nothing here is silent for long, so the idle timeout and
# deadline are only a guard against a hang; 40 attempts make a read reset every time (0.2^40
# at a 20% reset rate) impossible in practice.
RETRY = al.RetryPolicy(attempts=40, base_delay=0.01, max_delay=0.2, timeout=60.0,
                       deadline=300.0, hedge_after=None)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> list[str]:
    return rc.write_shards(tmp_path_factory.mktemp("big"), BIG_N, BIG_SHARDS)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> list[str]:
    return rc.write_shards(tmp_path_factory.mktemp("small"), SMALL_N, SMALL_SHARDS)


@pytest.fixture(scope="module")
def small_ref(small) -> list[list[int]]:
    """Record ids of every batch of the uninterrupted epoch (in-process, local files)."""
    return [rc.ids_of(b) for b in rc.pipeline(small).loader(workers=0)]


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def _delta(before: ProxyStats, after: ProxyStats) -> dict[str, int]:
    return {k: getattr(after, k) - getattr(before, k)
            for k in ("requests", "downloads", "faults", "resets", "slowed", "stalled")}


def _run(ds: al.Dataset, gcs, faults: dict | None = None, **kw) -> tuple[list, dict, dict]:
    """One epoch: batches, the loader's I/O stats, and what the proxy saw.

    Faults start after the first batch, so that opening the files (gcsfs metadata requests,
    which gcsfs retries on its own, out of the loader's sight) is never faulted.
    """
    before = gcs.proxy_stats
    batches = []
    try:
        it = ds.loader(workers=0, io_concurrency=64, prefetch=8, retry=RETRY, max_gap=0,
                       resident_bytes=0, **kw)
        for batch in it:  # the loop closes the loader
            batches.append(batch)
            if faults and len(batches) == 1:
                gcs.set_faults(**faults)
    finally:
        gcs.set_faults()
    return batches, it.stats().as_dict()["io"], _delta(before, gcs.proxy_stats)


# The libcurl client, whose every attempt is the loader's (gcsfs's reads, the "fsspec"
# client, retry inside one call, where no proxy count can tell them from the loader's).
GCS_CLIENT = gcs_client_for()
pytestmark = pytest.mark.skipif(GCS_CLIENT != "curl", reason="needs pycurl (the curl client)")


def _account(io: dict, proxy: dict) -> dict[str, int]:
    """Every faulted request led to exactly one more request, and the loader made it.

    Every reset goes through the loader's RetryPolicy (backoff, deadline, stats) but for
    libcurl's one re-send on a stale connection (below): the downloads (range GETs) the proxy
    saw are the loader's attempts. (gcsfs's metadata requests at open are left out: their
    number varies.)
    """
    hidden = proxy["downloads"] - io["requests"]
    http = io["statuses"].get("HTTP 503", 0) + io["statuses"].get("HTTP 429", 0)
    surfaced = sum(v for k, v in io["statuses"].items() if not k.startswith("HTTP "))
    assert http == proxy["faults"]  # every 503/429 reached the loader and was retried
    # libcurl re-sends a request, once, when the kept-alive connection it reused dies before
    # any byte of the answer (a stale connection), and has no switch to stop it: such a
    # reset costs one hidden request instead of a retry (no backoff, no stat).
    assert 0 <= hidden <= proxy["resets"]
    assert surfaced + hidden == proxy["resets"]
    assert io["retries"] == http + surfaced
    assert io["failures"] == 0
    return {"surfaced_resets": surfaced}


def test_10k_requests_through_a_flaky_bucket_match_the_fault_free_run(big):
    with local_gcs(proxy=True, seed=7) as gcs:
        urls = [gcs.upload(p, f"big/{Path(p).name}") for p in big]
        ds = rc.pipeline(urls, storage_options=gcs.storage_options, batch=64)
        t0 = time.monotonic()
        ref, ref_io, ref_proxy = _run(ds, gcs)
        t1 = time.monotonic()
        got, io, proxy = _run(ds, gcs, FLAKY)
        t2 = time.monotonic()
    _same(got, ref)
    ids = [i for b in got for i in rc.ids_of(b)]
    assert sorted(ids) == list(range(BIG_N))  # nothing lost, nothing repeated
    assert ref_io["retries"] == 0 and ref_proxy["faults"] == ref_proxy["resets"] == 0
    assert ref_proxy["downloads"] == ref_io["requests"]  # fault-free: one GET per attempt
    assert io["reads"] >= 10_000 and proxy["requests"] >= 10_000
    assert proxy["faults"] > 50 and proxy["resets"] > 5 and proxy["slowed"] > 10
    assert io["retries"] >= proxy["faults"] > 0
    acc = _account(io, proxy)
    print(f"\nflaky bucket: {proxy['requests']} requests, {proxy['faults']} x 503/429 "
          f"({io['statuses']}), {proxy['resets']} resets ({acc['surfaced_resets']} retried "
          f"by the loader), {proxy['slowed']} slow bodies; "
          f"loader retries {io['retries']}, reads {io['reads']}; fault-free {t1 - t0:.1f} s, "
          f"faulty {t2 - t1:.1f} s")


def test_every_reset_is_retried_by_the_loader(small):
    """At a 20% reset rate every dropped connection is retried under the RetryPolicy."""
    with local_gcs(proxy=True, seed=3) as gcs:
        urls = [gcs.upload(p, f"resets/{Path(p).name}") for p in small[:2]]
        ds = rc.pipeline(urls, storage_options=gcs.storage_options)
        ref, ref_io, ref_proxy = _run(ds, gcs)
        got, io, proxy = _run(ds, gcs, {"reset_rate": 0.2})
    _same(got, ref)
    assert ref_proxy["downloads"] == ref_io["requests"]
    acc = _account(io, proxy)
    # fresh connections reset: libcurl's "recv failure" (56)
    assert acc["surfaced_resets"] > 20
    assert all(k.startswith("libcurl error") for k in io["statuses"]), io["statuses"]
    print(f"\nresets: {proxy['resets']} of {proxy['requests']} requests, {acc}")


async def test_bucket_that_stops_answering_raises_within_the_deadline_then_resumes(small,
                                                                                   small_ref):
    retry = al.RetryPolicy(attempts=100, base_delay=0.01, max_delay=0.1, timeout=0.5,
                           deadline=2.0)
    stall_after = 10
    with local_gcs(proxy=True) as gcs:
        urls = [gcs.upload(p, f"stall/{Path(p).name}") for p in small]
        ds = rc.pipeline(urls, storage_options=gcs.storage_options)
        head: list[list[int]] = []
        state: dict | None = None
        stalled_at = 0.0

        async def consume() -> None:
            nonlocal state, stalled_at
            async with ds.loader(workers=0, prefetch=2, retry=retry, max_gap=0,
                                 resident_bytes=0) as it:
                async for batch in it:
                    head.append(rc.ids_of(batch))
                    state = json.loads(json.dumps(it.get_state()))
                    if len(head) == stall_after:
                        gcs.set_faults(stall=True)
                        stalled_at = time.monotonic()

        with pytest.raises(al.StorageError) as info:
            await asyncio.wait_for(consume(), 30)  # a hang fails here, not in CI's timeout
        took = time.monotonic() - stalled_at
        # bounded by the deadline (2 s), not by 100 attempts of 0.5 s silence each (>= 50 s)
        assert stalled_at and took < 5 * retry.deadline, took
        msg = str(info.value)
        assert "gs://" in msg and "stall/part-" in msg and "reading bytes [" in msg
        assert "attempts" in msg and "no answer within 0.5 s" in msg
        stalled = gcs.proxy_stats.stalled
        assert stalled > 0
        assert stall_after <= len(head) < len(small_ref)

        gcs.set_faults(stall=False)
        async with ds.loader(workers=0, retry=retry, max_gap=0, state=state,
                             resident_bytes=0) as it:
            rest = [rc.ids_of(b) async for b in it]
    assert head + rest == small_ref  # the union is the uninterrupted epoch, exactly
    print(f"\nstall: StorageError {took:.2f} s after the bucket stopped answering "
          f"(deadline {retry.deadline} s, timeout {retry.timeout} s); {stalled} requests "
          f"swallowed; {len(head)} batches before, {len(rest)} after resume")


def _child(*args: str) -> list[str]:
    return [sys.executable, str(CHILD), *args]


def _log_lines(log: Path) -> list[dict]:
    """The complete lines of the training log (a kill can leave half a line at the end)."""
    if not log.exists():
        return []
    return [json.loads(ln) for ln in log.read_text().splitlines(keepends=True)
            if ln.endswith("\n")]


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def test_training_process_killed_mid_epoch_resumes_from_its_checkpoint(tmp_path, small,
                                                                       small_ref):
    log, ckpt, every = tmp_path / "log.jsonl", tmp_path / "ckpt.json", 5
    args = [str(log), str(ckpt), str(every), "0.03", *small]
    proc = subprocess.Popen(_child("train", *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(_log_lines(log)) > 3 * every + 2 or proc.poll() is not None,
                  60, "the child to log some batches")
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err
    before = _log_lines(log)
    saved = json.loads(ckpt.read_text())
    done = saved["batches"]
    assert [ln["ids"] for ln in before] == small_ref[: len(before)]  # what it saw so far
    assert len(before) < len(small_ref)  # killed mid-epoch
    assert 0 < done <= len(before) and done % every == 0

    resumed = subprocess.run(_child("train", *args, "--resume"), capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["batches"] == len(small_ref)
    after = _log_lines(log)
    assert [ln["run"] for ln in after] == ["first"] * done + ["resumed"] * (len(after) - done)
    assert [ln["batch"] for ln in after] == list(range(len(small_ref)))
    new = [ln["ids"] for ln in after if ln["run"] == "resumed"]
    assert new == small_ref[done:]  # the rest of the epoch, exactly: nothing skipped
    ids = [i for ln in after for i in ln["ids"]]
    assert sorted(ids) == list(range(SMALL_N))  # nothing repeated
    print(f"\nkill -9: {len(before)} batches logged, checkpoint at {done}; the resumed run "
          f"replayed {len(before) - done} and finished the other {len(new) - (len(before) - done)}")


def _live(procs: list[tuple[int, float]]) -> list[int]:
    """Those of `procs` (pid, create_time) still running (a zombie counts as gone)."""
    out = []
    for pid, created in procs:
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _shm_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"aioloader-{pid}-"))


def test_workers_of_a_killed_training_process_exit_and_free_their_arena(tmp_path, small):
    log, ckpt = tmp_path / "log.jsonl", tmp_path / "ckpt.json"
    proc = subprocess.Popen(_child("train", str(log), str(ckpt), "5", "0.05", *small,
                                   "--workers", "1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    orphans: list[tuple[int, float]] = []
    workers: list[tuple[int, float]] = []
    try:
        _wait_for(lambda: len(_log_lines(log)) >= 3 or proc.poll() is not None, 60,
                  "the child to log some batches")
        assert proc.poll() is None
        ours = worker_pids(psutil.Process(proc.pid))
        for p in psutil.Process(proc.pid).children(recursive=True):
            orphans.append((p.pid, p.create_time()))
            if p.pid in ours:
                workers.append(orphans[-1])
        # the worker, the resource tracker, and (where it is used) the forkserver
        assert len(workers) == 1 and len(orphans) in (2, 3)
        assert memory_files(proc.pid, "aioloader-arena")  # (a memfd: the kernel frees it)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while (_live(orphans) or _shm_of(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _live(orphans) == [], "worker processes outlived their killed parent"
        assert _shm_of(proc.pid) == [], "the killed parent's arena is still in /dev/shm"
    finally:  # whatever aioloader left, the test removes: its own processes, by pid
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        # Workers first: the resource tracker then sees them go, unlinks the executor's
        # semaphores (/dev/shm/sem.mp-*) and exits; killed first, it would leak them.
        for pid in _live(workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(AssertionError):
            _wait_for(lambda: not _live(orphans), 10, "the resource tracker to exit")
        for pid in _live(orphans):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in _shm_of(proc.pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")
        _wait_for(lambda: not _live(orphans), 10, "the orphans to die")


def _our_children() -> set[int]:
    return worker_pids(psutil.Process())


def _describe(me: psutil.Process) -> list[tuple]:
    """Every descendant with its parent and command line (for an assertion message)."""
    out = []
    for p in me.children(recursive=True):
        try:
            out.append((p.pid, p.ppid(), " ".join(p.cmdline())[:80], p.status()))
        except psutil.Error as exc:
            out.append((p.pid, type(exc).__name__))
    return out


@pytest.mark.parametrize(("how", "fn", "signum"), [
    ("sigkill", rc.kill_on_id, signal.SIGKILL),
    ("segfault", rc.segfault_on_id, signal.SIGSEGV),
])
def test_worker_killed_mid_epoch_is_a_quick_clear_worker_error(tmp_path, small, small_ref, how,
                                                               fn, signum):
    # Far enough that the worker is still alive when counted after the first batch: tasks
    # grow to 8 batches after it, and with prefetch 2 batches up to ~17 are soon in work
    # (at 6, the crash sometimes came before the count: 0 workers seen).
    crash_batch = 40
    victim = small_ref[crash_batch][5]
    stamp = tmp_path / "crashed-at"
    transform = functools.partial(fn, victim=victim, stamp=str(stamp))
    ds = (al.Dataset.from_arrayrecord(small).shuffle(rc.SEED).map(rc.decode).map(transform)
          .batch(rc.BATCH))
    before = _our_children()
    it = ds.loader(workers=1, prefetch=2)
    batches = iter(it)
    try:
        got = [rc.ids_of(next(batches))]
        # (the first batch may have come from this process while the worker started)
        assert it.pool.wait_started(30)  # the worker is up: its start-up is not timed
        workers = _our_children() - before
        assert len(workers) == 1, (before, _describe(psutil.Process()))
        with pytest.raises(al.WorkerError) as info:
            for batch in batches:  # the for loop closes the loader on the error
                got.append(rc.ids_of(batch))
        raised = time.time()
    finally:
        it.close()  # a failure here must not leave the pool (and its arena) to later tests
    took = raised - float(stamp.read_text())
    # found by the pool seeing the exit (then up to ~2 s reading its exit status), not by a
    # timer; the margin is for a loaded machine
    assert took < 10.0, f"WorkerError {took:.2f} s after the crash"
    msg = str(info.value)
    assert "worker process died" in msg and "restart it from the last state" in msg
    # Small batches share tasks: the failed task is named by its output positions, it holds
    # the crashing record's batch, and every batch before that task was delivered, in order.
    lo, hi = map(int, re.search(r"output positions (\d+)\.\.(\d+)", msg).groups())
    assert lo <= crash_batch * rc.BATCH <= hi
    assert lo % rc.BATCH == 0 and got == small_ref[: lo // rc.BATCH]
    # The cause is named only when the exit status is read in time: Pool._exit_codes() races
    # the executor's manager thread, whose blocking waitpid() reaps the worker first in ~1 of
    # 6 runs (exitcode is then still None). Require it once the race is fixed in workers.py.
    if "signal" in msg:
        assert f"(signal {int(signum)})" in msg
    _wait_for(lambda: not (_our_children() - before), 10, "the worker processes to be gone")
    assert not psutil.pid_exists(next(iter(workers))) or \
        psutil.Process(next(iter(workers))).status() == psutil.STATUS_ZOMBIE
    print(f"\n{how}: WorkerError {took * 1e3:.0f} ms after the crash: {msg}")


@pytest.mark.parametrize("ending", ["return", "exception"])
def test_interpreter_exit_without_close_leaves_nothing(small, ending):
    extra = ["--raise"] if ending == "exception" else []
    run = subprocess.run(_child("exit-without-close", *small, *extra), capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert run.returncode == (0 if ending == "return" else 1), run.stderr
    info = json.loads(run.stdout.splitlines()[0])
    pid = info["pid"]
    assert len(info["ids"]) == 8 and info["arena"]  # it ran, with its arena
    workers = [c for c in info["children"] if not is_stdlib_helper(c["cmdline"], c["ppid"], pid)]
    assert len(workers) == 2
    deadline = time.monotonic() + 10

    def leftovers() -> tuple[list[str], list[int]]:
        alive = []
        for c in info["children"]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p = psutil.Process(c["pid"])
                if p.status() != psutil.STATUS_ZOMBIE and " ".join(p.cmdline()) == c["cmdline"]:
                    alive.append(c["pid"])
        return _shm_of(pid), alive

    while any(leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers() == ([], []), f"left behind by pid {pid}: {leftovers()}"
    assert "leaked" not in run.stderr, run.stderr  # e.g. the resource tracker's warnings
    if ending == "exception":
        assert "RuntimeError: falling over with the loader open" in run.stderr
