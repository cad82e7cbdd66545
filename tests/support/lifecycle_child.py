"""The processes tests/workers/test_lifecycle.py forks, interrupts and kills.

Imported by the tests (and by loader worker processes, which import the transforms below by
name), and run as a script, each mode printing one JSON line when it is ready::

    python tests/support/lifecycle_child.py fork PATH...
    python tests/support/lifecycle_child.py hang WORKERS PATH...
    python tests/support/lifecycle_child.py slow WORKERS PATH...
    python tests/support/lifecycle_child.py run WORKERS PATH...

``fork`` uses the sync API (an open source, a loader mid-stream), then forks: with
`os.fork()` and with a fork-based `multiprocessing.Pool`, and reports what works in the child.
``hang`` iterates a loader whose transform never returns (and swallows KeyboardInterrupt), for
the test to press Ctrl-C. ``slow`` iterates slowly, for the test to SIGKILL the process group.
``run`` iterates to the end and exits, saying which /dev/shm names it and its workers held
halfway.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

if __name__ == "__main__":  # run as a script: import this file's package the same way tests do
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aioloader as al
from tests.support import reliability_child as rc
from tests.support.procs import memory_files, shm_files, worker_pids

_STUCK = threading.Event()  # set when never_returns is entered (in this process)


def never_returns(element: dict) -> dict:
    """A transform stuck for good: Ctrl-C (KeyboardInterrupt) does not stop it either."""
    _STUCK.set()
    while True:
        with contextlib.suppress(BaseException):
            time.sleep(3600)


def _say(**kw) -> None:
    print(json.dumps(kw), flush=True)


def _hung(signum, frame) -> None:
    raise TimeoutError("hung for 20 s")


def _outcome(fn) -> str:
    """'ok: <result>' or '<ExceptionType>: <message>', timed; a hang is cut at 20 s."""
    t0 = time.monotonic()
    old = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(20)
    try:
        out = f"ok: {fn()}"
    except BaseException as exc:  # reported to the test
        out = f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return f"{out} [{time.monotonic() - t0:.1f} s]"


def _first_ids(paths, workers: int) -> list[int]:
    with rc.pipeline(paths, batch=8).loader(workers=workers, prefetch=2) as it:
        return rc.ids_of(next(iter(it)))


def _len_of_new_source(paths) -> int:
    with al.ArrayRecordSource(paths) as src:
        return len(src)


_INHERITED: list = []


def _len_of_inherited_source() -> int:
    return len(_INHERITED[0][[0, 1]])


def fork(paths: list[str]) -> int:
    src = al.ArrayRecordSource(paths)
    _INHERITED.append(src)
    n = len(src)
    loader = rc.pipeline(paths, batch=8).loader(workers=1, prefetch=2)
    it = iter(loader)
    first = rc.ids_of(next(it))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: each use must work or fail at once, never hang
        os.close(r)
        report = {
            "new_source": _outcome(lambda: _len_of_new_source(paths)),
            "inherited_source": _outcome(lambda: (len(src), len(src[[0, n - 1]]))),
            "inherited_iterator": _outcome(lambda: rc.ids_of(next(it))),
            "new_loader_0": _outcome(lambda: _first_ids(paths, 0)),
            "new_loader_1": _outcome(lambda: _first_ids(paths, 1)),
        }
        os.write(w, json.dumps(report).encode())
        os.close(w)
        src.close()
        sys.exit(0)  # a normal exit: atexit handlers run, and must not touch the parent's
    os.close(w)
    with os.fdopen(r) as f:
        report = json.loads(f.read() or "{}")
    _, status = os.waitpid(pid, 0)
    report["child_exit"] = os.waitstatus_to_exitcode(status)
    # The parent goes on as if nothing happened.
    report["parent_next"] = _outcome(lambda: rc.ids_of(next(it)) != first)
    report["parent_source"] = _outcome(lambda: len(src[[0, 1]]))
    with multiprocessing.get_context("fork").Pool(1) as pool:
        report["fork_pool"] = _outcome(lambda: pool.apply_async(
            _len_of_new_source, (paths,)).get(30))
        report["fork_pool_inherited"] = _outcome(lambda: pool.apply_async(
            _len_of_inherited_source).get(30))
    loader.close()
    src.close()
    _say(n=n, **report)
    return 0


def hang(n: int, paths: list[str], executor: str = "processes") -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it hangs, if it does
    ds = rc.pipeline(paths, batch=8).map(never_returns)
    loader = ds.loader(workers=n, prefetch=2, executor=executor)
    loader.start_prefetch()
    me = __import__("psutil").Process()
    deadline = time.monotonic() + 30
    workers: set[int] = set()
    in_process = n == 0 or executor == "threads"
    if in_process:  # the inline thread (or a thread of the executor) is in the transform
        _STUCK.wait(30)
    # else: the worker is up, and (after 0.5 s) in it
    while not in_process and time.monotonic() < deadline:
        workers = {p for p in worker_pids(me) if "forkserver" in " ".join(
            __import__("psutil").Process(p).cmdline())}
        if workers:
            break
        time.sleep(0.05)
    time.sleep(0.5)
    # Ready is said from another thread once this one is waiting in the loop: said before
    # the loop, a Ctrl-C sent at once could land in the print, not in the iteration.
    threading.Timer(0.3, _say, kwargs={"pid": os.getpid(),
                                       "workers": sorted(workers)}).start()
    for _ in loader:
        pass
    return 0


def _running(workers: int, batches):
    """`batches`, with the count of those seen since the loader was past its start-up:
    each of its `workers` had mapped the arena (the last thing a worker does to start), and
    `prefetch` + 2 batches came after that (results finished after it)."""
    me = __import__("psutil").Process()
    since = None
    for batch in batches:
        if since is None:
            up = worker_pids(me)
            if len(up) == workers and all(memory_files(p, "aioloader-arena") for p in up):
                since = -3  # prefetch=2: results that may have finished before
        else:
            since += 1
        yield (since if since is not None and since > 0 else 0), batch


def slow(workers: int, paths: list[str]) -> int:
    me = __import__("psutil").Process()
    said = False
    loader = rc.pipeline(paths, batch=8).loader(workers=workers, prefetch=2)
    for since, _ in _running(workers, loader):
        if since and not said:
            _say(pid=os.getpid(), held=sorted(shm_files({me.pid, *worker_pids(me)})))
            said = True
        time.sleep(0.05)
    return 0


def run(workers: int, paths: list[str]) -> int:
    me = __import__("psutil").Process()
    held: list[str] | None = None
    n = 0
    loader = rc.pipeline(paths, batch=8).loader(workers=workers, prefetch=2)
    for since, _ in _running(workers, loader):
        if since and held is None:
            held = sorted(shm_files({me.pid, *worker_pids(me)}))
        n += 1
    _say(batches=n, held=held)
    return 0


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    try:
        if mode == "fork":
            return fork(args)
        if mode == "hang":
            return hang(int(args[0]), args[1:])
        if mode == "hang-threads":
            return hang(int(args[0]), args[1:], executor="threads")
        if mode == "slow":
            return slow(int(args[0]), args[1:])
        if mode == "run":
            return run(int(args[0]), args[1:])
    except Exception:
        traceback.print_exc()
        return 2
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    from tests.support.lifecycle_child import main as _main

    sys.exit(_main(sys.argv[1:]))
