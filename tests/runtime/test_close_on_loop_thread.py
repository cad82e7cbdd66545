"""Closing works from any thread, the background loop's own included: a finalizer or the
garbage collector may run there (where nothing can wait on the loop), and an explicit
`close()` may be called from a callback on it. Each case runs in a fresh interpreter, whose
stderr must stay clean and whose file descriptors must come back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aioloader as al

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="/proc/self/fd")

PRELUDE = """
import asyncio, gc, json, os, sys, time
import aioloader as al
from aioloader.io import sync

PATH = sys.argv[1]

def fds():
    return len(os.listdir("/proc/self/fd"))

def on_loop(fn):
    async def call():
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), sync.background_loop()).result(30)

def warm_up():  # what a first use keeps for the process (a pipe) is not a leak
    with al.ArrayRecordSource(PATH) as src:
        len(src)
    return fds()

def settled(target, seconds=10):
    deadline = time.monotonic() + seconds
    while fds() > target and time.monotonic() < deadline:
        time.sleep(0.02)
    return fds()
"""


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("close") / "r.array_record"
    with al.ArrayRecordWriter(p, group_size=1) as w:
        for i in range(50):
            w.write(b"%d" % i)
    return str(p)


def _run(body: str, *args: str, **env: str) -> tuple[dict, str]:
    code = PRELUDE + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=120, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Exception ignored" not in out.stderr, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_datasets_collected_on_the_loop_thread_close_their_files(path):
    """The loop of the report: `ds[0]` and `list(ds.shuffle(1))` on fresh datasets, which
    the collector frees wherever it runs; plus collections forced on the loop's thread."""
    got, _ = _run("""
        before = warm_up()
        counts = []
        for i in range(20):
            ds = al.Dataset.from_arrayrecord(PATH); ds[0]; list(ds.shuffle(1))
            if i % 5 == 4:
                cycle = [ds]; cycle.append(cycle); del ds, cycle
                on_loop(gc.collect)  # the collector runs on the loop's own thread
            counts.append(fds())
        ds = None
        gc.collect()
        print(json.dumps({"before": before, "counts": counts, "after": settled(before)}))
    """, path)
    assert got["after"] <= got["before"], got
    assert max(got["counts"][10:]) <= max(got["counts"][:10]), got


def test_a_dataset_dropped_in_a_thread_the_loop_waits_on(path):
    """The collector may free a dataset in any thread: one the loop is waiting on too (one it
    is starting, say). Its files' closing must not wait on the loop there."""
    got, _ = _run("""
        import threading
        before = warm_up()
        ds = al.Dataset.from_arrayrecord(PATH); ds[0]
        holder = [ds]; del ds

        def start_and_wait():  # on the loop: a thread in which the dataset is freed
            t = threading.Thread(target=holder.clear)
            t.start(); t.join(5)
            return t.is_alive()

        stuck = on_loop(start_and_wait)
        print(json.dumps({"stuck": stuck, "before": before, "after": settled(before)}))
    """, path)
    assert got == {"stuck": False, "before": got["before"], "after": got["before"]}


def test_a_source_closed_from_the_loop_thread(path):
    got, _ = _run("""
        before = warm_up()
        src = al.ArrayRecordSource(PATH)
        n = len(src)
        on_loop(src.close)
        after = settled(before)
        print(json.dumps({"n": n, "before": before, "after": after,
                          "loop": sync._loop is None}))
    """, path)
    assert got == {"n": 50, "before": got["before"], "after": got["before"], "loop": True}


def test_a_loader_closed_from_the_loop_thread(path):
    got, _ = _run("""
        before = warm_up()
        loader = al.Dataset.from_arrayrecord(PATH).batch(5).loader(workers=0)
        it = iter(loader)
        first = next(it)
        on_loop(loader.close)
        rest = list(it)  # the iteration ends as after the last batch
        print(json.dumps({"closed": loader.closed, "first": len(first), "rest": len(rest),
                          "after": settled(before), "before": before}))
    """, path)
    assert got["closed"] and got["first"] == 5 and got["rest"] <= 9
    assert got["after"] <= got["before"], got


@pytest.mark.parametrize("workers", [0, 1])
def test_a_loader_failing_at_open_logs_its_stats_cleanly(tmp_path, workers):
    """With AIOLOADER_DEBUG=1 the loader logs its stats as its iteration ends: after a
    failed open, that must not try to open the files again from the loop (a logging
    error)."""
    bad = tmp_path / "bad.array_record"
    bad.write_bytes(b"x" * 100)
    got, err = _run("""
        try:
            list(al.Dataset.from_arrayrecord(PATH).loader(workers=int(sys.argv[2])))
        except Exception as exc:
            print(json.dumps({"error": type(exc).__name__}))
    """, str(bad), str(workers), AIOLOADER_DEBUG="1")
    assert got == {"error": "ArrayRecordFormatError"}
    assert "Logging error" not in err, err[-3000:]
    assert "RuntimeError" not in err, err[-3000:]


def test_a_finalizer_that_releases_inside_the_loops_lock_does_not_deadlock():
    """A collection can run a finalizer (a source's close -> `release`) on a thread that is
    inside `acquire`/`release` already, holding the bridge's lock: it must not wait on
    itself."""
    import threading

    from aioloader.io import sync

    class User:
        pass

    user = User()
    sync.acquire(user)
    done = threading.Event()

    def nested() -> None:
        with sync._lock:  # what a finalizer run during a locked weakref operation sees
            sync.release(user)
        done.set()

    t = threading.Thread(target=nested, daemon=True)
    t.start()
    assert done.wait(10), "release() waited on the lock its own thread held"
