"""How the decode pool's processes start and stop: the start method, the worker server
started early, and stopping workers that do not exit.

Workers are forks of a worker server (`aioloader.workers.server`: aioloader's own
forkserver, where there is one): one clean process that has loaded NumPy and
`aioloader.workers.worker`, of which each worker is a fork (a few ms instead of a fresh
interpreter's start). Never plain fork of the parent: it runs an event loop and threads
(and, in training, JAX's). Neither the server nor a worker imports the user's `__main__`, so
a script without an `if __name__ == "__main__":` guard runs once. The server itself is a
fresh interpreter whose start-up (~0.1-0.7 s: NumPy, the worker's modules) used to be the
first batch's wait, so it is started when `aioloader` is imported (`start_early`: ~10 ms of
the importing process, the server loads in parallel), and the first pool finds it ready. Its
environment says it is a worker's (`server.WORKER_ENV`), so it and its workers load only
the modules a worker uses, not the parent's side of the package. The server's environment is
the one at import: each worker is handed the parent's as it is when its pool is made
(`worker._init_worker`). `AIOLOADER_EARLY_FORKSERVER=0` turns the early start off (the pool
then starts the server on first use, as before).

Where there is no forkserver, workers are spawned: they then import `__main__` as
multiprocessing's spawn does, and a script needs the guard (a dead worker's error says so).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
import weakref
from typing import Any

log = logging.getLogger("aioloader")

EARLY_ENV = "AIOLOADER_EARLY_FORKSERVER"

_forked = False  # this process is a fork of one that may have started the forkserver
_live_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _forked, _live_pools
    _forked = True
    _live_pools = weakref.WeakSet()  # the parent's, not ours to close


os.register_at_fork(after_in_child=_after_fork_in_child)


def context() -> multiprocessing.context.BaseContext:
    """The worker server's context where there is a forkserver (Linux, macOS), else spawn.
    Starts the server if it is not running."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        from . import server

        server.ensure_running()
        return server.WorkerContext()
    return multiprocessing.get_context("spawn")


def start_early() -> None:
    """Start the worker server now (at `import aioloader`), so that it has loaded by the time a
    pool wants its first worker. Only in a top process (not a worker, not a forked child, not
    any multiprocessing child), where there is a forkserver, and unless
    `AIOLOADER_EARLY_FORKSERVER=0`. Never raises: the pool starts it on first use anyway."""
    if (os.environ.get(EARLY_ENV, "1") == "0"
            or _forked or multiprocessing.parent_process() is not None
            or "forkserver" not in multiprocessing.get_all_start_methods()):
        return
    from .server import WORKER_ENV  # (the server's, which `context` imports anyway)

    if os.environ.get(WORKER_ENV) == "1":
        return
    try:
        context()
    except Exception as exc:  # e.g. no /dev/shm, or a sandbox refusing processes
        log.debug("could not start the worker server early (%s: %s)", type(exc).__name__, exc)


def track(pool: Any) -> None:
    """Close `pool` at interpreter exit if nobody did (`_close_pools_at_exit`)."""
    _live_pools.add(pool)


def _close_pools_at_exit() -> None:
    """Close the pools nobody closed, before concurrent.futures joins their manager threads
    at interpreter exit (which waits for every running task: for ever, if a transform never
    returns). Runs first: threading's exit hooks run in reverse order of registration."""
    for pool in list(_live_pools):
        with contextlib.suppress(Exception):
            pool.close()


getattr(threading, "_register_atexit", atexit.register)(_close_pools_at_exit)


def stop(procs: list, grace: float) -> None:
    """Wait up to `grace` s for `procs` to exit (the executor asked them to), then SIGTERM,
    then SIGKILL. Waits on their sentinels only: their exit status is the executor's to
    read."""
    def wait_for_exit(seconds: float) -> list:
        deadline = time.monotonic() + seconds
        while True:
            left = [p for p in procs if not multiprocessing.connection.wait([p.sentinel], 0)]
            rest = deadline - time.monotonic()
            if not left or rest <= 0:
                return left
            multiprocessing.connection.wait([p.sentinel for p in left], rest)

    left = wait_for_exit(grace)
    for how in ("terminate", "kill"):
        if not left:
            return
        for p in left:
            with contextlib.suppress(OSError, ValueError):
                getattr(p, how)()
        left = wait_for_exit(1.0)
