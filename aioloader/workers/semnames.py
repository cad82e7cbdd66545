"""A process pool's named semaphores: their names go as soon as every worker has them open.

multiprocessing's queues lock with POSIX named semaphores (`/dev/shm/sem.mp-*` on Linux)
when workers are spawned or forked by the forkserver: a new worker opens them by name while
it unpickles the queues. multiprocessing removes the names when the pool is collected, or
its resource tracker does at interpreter exit; but a SIGKILL of the whole process group
(what a job scheduler or an OOM kill does) takes the tracker down too, and every run leaves
its names behind in /dev/shm for good. Once every worker has opened them the names serve
nothing: unlinking them leaves the semaphores working in every process that has them open,
and the kernel frees them with the last one, as it does our memory files (`memfile`). Then
no kill can leave anything behind, rather than most exits not doing so.

This reaches into private parts of the standard library (the executor's queues, `SemLock`'s
handle and its `multiprocessing.util` finalizer), read against CPython 3.10 to 3.13: any
other layout only loses this clean-up, never the pool.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

log = logging.getLogger("aioloader")


def pool_semaphores(executor: Any) -> list:
    """The `multiprocessing` semaphores and locks of a `ProcessPoolExecutor`'s queues (its
    other locks are `threading` ones); empty where its layout is not the one we know."""
    try:
        from multiprocessing.synchronize import SemLock

        if getattr(executor, "_max_tasks_per_child", None) is not None:
            return []  # it replaces workers as they retire: new ones need the names
        queues = (executor._call_queue, executor._result_queue)
        return [v for q in queues if q is not None for v in vars(q).values()
                if isinstance(v, SemLock)]
    except Exception:
        return []


def forget_names(locks: list) -> int:
    """Unlink the names of `locks` (multiprocessing `SemLock`s), and tell multiprocessing
    they are gone; how many were unlinked.

    Only once no process will open them by name again: every worker of the pool has started,
    and the pool starts no other (`ProcessPoolExecutor` replaces no dead worker: one dying
    breaks the pool). Linux only (elsewhere no-op, untested); a lock made in a fork context
    has no name (unlinked at creation).
    """
    if sys.platform != "linux":
        return 0
    n = 0
    try:
        import _multiprocessing
        from multiprocessing import resource_tracker, util
        from multiprocessing.synchronize import SemLock

        for lock in locks:
            name = getattr(getattr(lock, "_semlock", None), "name", None)
            if not name:
                continue
            with contextlib.suppress(FileNotFoundError):
                _multiprocessing.sem_unlink(name)
            n += 1
            # The tracker would unlink it again at exit and warn of a leak; the finalizer
            # `SemLock._cleanup` would unlink it again when the lock is collected and fail.
            resource_tracker.unregister(name, "semaphore")
            for fin in list(util._finalizer_registry.values()):  # type: ignore[attr-defined]
                cleanup = SemLock._cleanup  # type: ignore[attr-defined]
                if getattr(fin, "_callback", None) is cleanup and \
                        getattr(fin, "_args", None) == (name,):
                    fin.cancel()
    except Exception as exc:  # a different Python: the names stay, as without this
        log.debug("could not unlink the pool's semaphore names: %r", exc)
    return n
