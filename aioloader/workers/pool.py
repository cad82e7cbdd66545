"""The decode pool: the parent's side of the worker processes that turn fetched chunks into
finished batches (what runs in a worker, and the messages, are `aioloader.workers.worker`).

A task says where the chunks of one batch or window lie, with the fetched bytes of remote
ones; the worker decodes, runs the record transforms, and collates inside the process, so
that only finished batches come back. Bytes travel through the shared-memory arena both ways
(`aioloader.workers.arena`): the batch's arrays are stacked right in a slot and lent to the consumer
as views; what does not fit, or finds no free slot, travels by value through the pipe
instead; records of one chunk (group size > 1) ship its bytes once. Local files are read by
the workers themselves. Each worker keeps decoded multi-record chunks across tasks
(`aioloader.workers.decode`), in its share of `Pipeline.chunk_cache_bytes`.

Workers are forks of a clean worker server, started when the first loader with workers is
made or by `aioloader.warm_up()` (`aioloader.workers.procs`, `.server`; never of the parent,
which runs an event loop and threads; never importing the user's `__main__`), and
`workers=0` runs the same task code on one daemon thread of the parent, for debugging
(`aioloader.workers.inline`); both are an `Executor` (`aioloader.workers.executor`), and
`open_executor` (`aioloader.workers.kinds`) picks one. The pool also runs tasks on such a
thread itself: all of them while the tuner has set 0 workers, and, with `first_in_parent`
(off by default: `WorkerOptions.first_in_parent`), the first ones, one at a time, while no
worker is up: the first batch then waits for neither the worker server nor a worker's start.
Workers ignore Ctrl-C: the parent decides, and `Pool.close` gives a worker still busy
`CLOSE_GRACE_S` seconds to finish before terminating it, so a transform that never returns
cannot hold up a shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..errors import WorkerError
from ..io.descriptors import too_many_open
from .executor import CLOSE_GRACE_S, SlotExecutor
from .inline import InlineExecutor
from .inputs import input_bytes, ship_inputs
from .messages import Pipeline, Task
from .procs import context, start_server, stop, track
from .semnames import forget_names, pool_semaphores
from .worker import _init_worker, _pack_pipeline, run_task

__all__ = ["CLOSE_GRACE_S", "PROCESSES", "Pool", "Processes"]

log = logging.getLogger("aioloader")


class Processes:
    """The "processes" executor kind (`aioloader.workers.kinds`): a `Pool`."""

    name = "processes"

    def prepare(self, dataset: Any) -> None:
        """A transform that cannot travel to a worker process is refused before any starts;
        the worker server starts loading now (`procs.start_server`)."""
        dataset.check_picklable()
        start_server()

    def open(self, pipeline: Pipeline, workers: int, *, slots: int, slot_size: int,
             lanes: int | None, first_in_parent: bool) -> Pool:
        return Pool(pipeline, workers, slots=slots, slot_size=slot_size, lanes=lanes,
                    first_in_parent=first_in_parent)


class Pool(SlotExecutor):
    """Runs tasks in `workers` processes (and in this process while the tuner says 0)."""

    def __init__(self, pipeline: Pipeline, workers: int, *, slots: int,
                 slot_size: int = 32 << 20, lanes: int | None = None,
                 first_in_parent: bool = False) -> None:
        if workers < 1:
            raise ValueError("a pool has at least one worker process (0: `Inline`)")
        super().__init__(pipeline, workers, slots=slots, slot_size=slot_size, lanes=lanes)
        self._procs: list = []
        self._warming: threading.Thread | None = None
        self._spawn_error: OSError | None = None  # out of descriptors starting workers
        # With `first_in_parent`, until a worker is up (a new process's workers take a while:
        # the forkserver is a fresh interpreter), one task at a time runs on a thread of this
        # process instead, with the same code (`run_task`): the first batch need not wait.
        self._up = threading.Event()
        self._first: InlineExecutor | None = None
        self._first_busy = False
        self._let_go = False  # whether the chunks decoded here were let go (`_here`)
        # Off unless the loader asks for it (`WorkerOptions.first_in_parent`): with it, a
        # transform that crashes its process (a segfault in a C decoder, os._exit) takes
        # this one down if it does so in a first task, instead of a worker (a WorkerError).
        self._first_in_parent = first_in_parent
        # workers="auto" tuned down to 0: every task runs on that thread of this process
        self._in_parent = lanes == 0
        self._names_lock = threading.Lock()
        self._unstarted = workers  # workers that have not yet released `_started`
        try:
            ctx = context()
            # spawned workers import `__main__` (`procs`): an unguarded script runs again
            self._guard_hint = ("; workers are spawned here, and each imports your script: put "
                                "its body under `if __name__ == \"__main__\":`"
                                if ctx.get_start_method() == "spawn" else "")
            self._started = ctx.Semaphore(0)
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=ctx,
                initializer=_init_worker,
                # (this process's environment now: the forkserver's is the one at its start)
                initargs=(_pack_pipeline(pipeline), self._started, self.cache_bytes,
                          dict(os.environ)),
            )
        except BaseException:
            self.arena.close()
            raise
        track(self)

    def set_workers(self, workers: int) -> None:
        super().set_workers(workers)
        self._in_parent = workers == 0  # 0: one lane, a thread of this process

    def settled(self) -> bool:
        return self._in_parent or self.all_started()

    def warm_up(self) -> None:
        """Start the worker processes now instead of on first use, on a thread, while the
        files open: the first one waits for the forkserver until it has loaded NumPy and
        the worker's code (started when the loader was made, or by `aioloader.warm_up()`:
        `aioloader.workers.procs`)."""
        if self._warming is None:
            self._warming = threading.Thread(target=self._spawn, name="aioloader-spawn",
                                             daemon=True)
            self._warming.start()

    def wait_started(self, timeout: float | None = None) -> bool:
        return self._up.wait(timeout)

    def all_started(self) -> bool:
        if self._up.is_set() and self._unstarted:
            self._forget_names()  # counts those up since
        return self._up.is_set() and not self._unstarted

    def _spawn(self) -> None:
        try:
            self._start_workers()
        except OSError as err:  # out of descriptors: said (with the limit) at the next task
            if err.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            self._spawn_error = too_many_open(err, "starting worker processes")

    def _start_workers(self) -> None:
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            for _ in range(self.workers):
                fut = self._executor.submit(os.getpid)
                fut.add_done_callback(self._forget_names)
                fut.add_done_callback(lambda f: f.exception() or self._up.set())  # type: ignore[func-returns-value]
        self._procs = list((getattr(self._executor, "_processes", None) or {}).values())

    def _forget_names(self, _: Any = None) -> None:
        """Once every worker has started (each releases `_started` when it has unpickled the
        queues, opening their semaphores by name), unlink those names, so that no kill can
        leave them in /dev/shm (`aioloader.workers.semnames`). Checked at each result: until then
        (the workers' start-up) a kill of the whole group still leaves them."""
        with self._names_lock:
            if not self._unstarted:
                return
            while self._unstarted and self._started.acquire(False):
                self._unstarted -= 1
            if not self._unstarted:
                forget_names([*pool_semaphores(self._executor), self._started])

    def reserve(self, nbytes: int) -> None:
        """Make slots hold `nbytes` before the first task (a guess from the plan: a batch of
        records of the files' mean size), so big batches take shared memory at once rather
        than after a task that found its slot too small."""
        self.arena.grow(nbytes)

    async def _route(self, task: Task, room: bool) -> InlineExecutor | None:
        """The thread to run `task` on in this process (see `_here`), or None: a worker."""
        here = self._here()
        warming = self._warming
        if here is None and warming is not None and warming.is_alive():
            # Submitting now would wait, on the loop, for the spawning thread (it holds the
            # executor's lock until the forkserver is up): wait off the loop instead.
            await asyncio.get_running_loop().run_in_executor(None, warming.join)
        if task.raws is not None and room:
            with contextlib.suppress(OSError):  # (else they go through the pipe)
                self.arena.grow(input_bytes(task))
        return here

    def _submit(self, task: Task, slot: int, describe: str, route: InlineExecutor | None
                ) -> tuple[Future, bool]:
        arena = self.arena
        if route is not None:
            where = arena.map_of(slot) if slot >= 0 else None
            cf = route.submit(run_task, task, self.pipeline, self._decoder, where, True,
                              label=describe)
            cf.add_done_callback(self._first_done)
            return cf, True
        task.arena = arena.where(slot) if slot >= 0 else None
        if task.raws is not None:
            ship_inputs(task, arena, slot)
        if self._spawn_error is not None:
            raise self._spawn_error
        return self._executor.submit(run_task, task), False

    def _came_back(self, here: bool) -> None:
        if not here:
            self._up.set()
        if self._unstarted:
            self._forget_names()

    def _failed(self, exc: BaseException, describe: str) -> BaseException:
        if not isinstance(exc, BrokenProcessPool):
            return exc
        return WorkerError(
            f"a worker process died while processing {describe}{self._exit_codes()}; the "
            "loader cannot continue (restart it from the last state; if a transform crashes "
            "the interpreter, run with workers=0 to debug)" f"{self._guard_hint}")

    def _here(self) -> InlineExecutor | None:
        """The thread to run the next task on in this process: while the tuner says 0
        workers, or while no worker is up yet and no other task runs here (see `_up`)."""
        if self._in_parent and not self._closed:
            self._first = self._first or InlineExecutor("aioloader-first-tasks")
            return self._first
        if self._up.is_set() and self._first is not None and not self._let_go:
            self._let_go = True  # the workers took over: the chunks decoded here go
            with contextlib.suppress(RuntimeError):  # (closed meanwhile)
                self._first.submit(self._decoder.cache.clear, label="clearing its cache")
        if not self._first_in_parent or self._up.is_set() or self._first_busy or self._closed:
            return None
        if self._first is None:
            self._first = InlineExecutor("aioloader-first-tasks")
        self._first_busy = True
        return self._first

    def _first_done(self, _: Any) -> None:
        self._first_busy = False

    def _exit_codes(self) -> str:
        """How the dead worker died, e.g. ' (signal 9)'; waits briefly for its exit status."""
        procs = self._procs or list((getattr(self._executor, "_processes", None) or {})
                                    .values())
        # The executor's manager thread reads the dead worker's status from the forkserver
        # as it handles the broken pool; reading it at the same time from here, one of the two
        # gets EOF, which multiprocessing reports as exit code 255. Let it finish first (its
        # reading is then cached on the process).
        manager = getattr(self._executor, "_executor_manager_thread", None)
        if manager is not None and manager is not threading.current_thread():
            manager.join(1.0)
        deadline = time.monotonic() + 1.0
        codes: list[int] = []
        while procs and time.monotonic() < deadline:
            codes = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if codes:
                break
            time.sleep(0.02)
        if not codes:
            return ""
        signals = [f"signal {-c}" for c in codes if c < 0]
        return f" ({', '.join(signals) if signals else f'exit code {codes[0]}'})"

    def _stop(self, grace: float) -> None:
        """A worker still busy after `grace` seconds (a transform that never returns) is
        terminated, then killed."""
        ex = self._executor
        if self._warming is not None:  # (it ends once the forkserver is up)
            self._warming.join()
        t0 = time.monotonic()
        procs = list((getattr(ex, "_processes", None) or {}).values())
        ex.shutdown(wait=not procs, cancel_futures=True)
        # one grace for all: the task running here (while the workers started) and theirs
        if self._first is not None and self._first.close(grace) is not None:
            log.warning("a task run in this process while the workers started is still "
                        "running %.0f s after close; its thread is left behind (a daemon "
                        "thread: it does not keep the process from exiting)", grace)
        if procs:
            try:
                stop(procs, max(0.0, grace - (time.monotonic() - t0)))
            except BaseException:  # Ctrl-C again while waiting: no more grace
                for p in procs:
                    with contextlib.suppress(OSError, ValueError):
                        p.kill()
                raise
            ex.shutdown(wait=True)  # the workers are gone: the manager thread ends at once
        with self._names_lock:  # closed before every worker came up: none will open the
            if self._unstarted:  # semaphores by name now, so their names go too
                self._unstarted = 0
                forget_names([*pool_semaphores(ex), self._started])


PROCESSES = Processes()
