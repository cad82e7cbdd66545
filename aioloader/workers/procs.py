"""How the decode pool's processes start and stop: the start method, the worker server, and
stopping workers that do not exit.

Workers are forks of a worker server (`aioloader.workers.server`: aioloader's own
forkserver, where there is one): one clean process that has loaded NumPy and
`aioloader.workers.worker`, of which each worker is a fork (a few ms instead of a fresh
interpreter's start). Never plain fork of the parent: it runs an event loop and threads
(and, in training, JAX's). Neither the server nor a worker imports the user's `__main__`, so
a script without an `if __name__ == "__main__":` guard runs once. The server itself is a
fresh interpreter whose start-up (~0.1-0.7 s: NumPy, the worker's modules) would be the
first batch's wait, so it starts as early as it is known to be wanted: when a loader with
workers is made (`runtime.loader`), or before that when the user calls `aioloader.warm_up()`
(`runtime.warmup`) — never at `import aioloader`, which starts no process. Its
environment says it is a worker's (`server.WORKER_ENV`), so it and its workers load only the
modules a worker uses, not the parent's side of the package. The server's environment is the
one at its start: each worker is handed the parent's as it is when its pool is made
(`worker._init_worker`).

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

_live_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _live_pools
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


def start_server() -> None:
    """Start the worker server now, so that it has loaded NumPy and the worker's code by the
    time the first pool wants a worker (a loader with workers calls it when it is made, and
    `aioloader.warm_up()` earlier). Returns at once (the server loads in its own process);
    does nothing when it is already running, or where workers are spawned (no forkserver).
    Never raises: a server that cannot start is the pool's error to report, when one is
    wanted."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    try:
        context()
    except Exception as exc:  # e.g. no /dev/shm, or a sandbox refusing processes
        log.debug("could not start the worker server (%s: %s)", type(exc).__name__, exc)


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
