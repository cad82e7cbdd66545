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
(`aioloader.workers.inline`).
Workers ignore Ctrl-C: the parent decides, and `Pool.close` gives a worker still busy
`CLOSE_GRACE_S` seconds to finish before terminating it, so a transform that never returns
cannot hold up a shutdown (with workers=0 the stuck thread is left behind, with a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..descriptors import too_many_open
from ..errors import WorkerError
from .arena import Arena, Blob, Pickled, array_leaves
from .decode import Decoder
from .extract import StashFile
from .inline import InlineExecutor
from .inputs import input_bytes, ship_inputs
from .messages import Pipeline, Result, Task
from .procs import context, stop, track
from .semnames import forget_names, pool_semaphores
from .worker import (
    _init_worker,
    _pack_pipeline,
    _raise_malloc_thresholds,
    run_task,
)

__all__ = ["CLOSE_GRACE_S", "Pool"]

log = logging.getLogger("aioloader")
CLOSE_GRACE_S = 2.0  # how long close() lets a busy worker finish before terminating it


def _retrieve(fut: asyncio.Future) -> None:
    """Mark a future's exception as seen (its waiter may have been cancelled)."""
    if not fut.cancelled():
        fut.exception()


class Pool:
    """Runs tasks in `workers` processes (or inline on one thread when workers == 0)."""

    def __init__(self, pipeline: Pipeline, workers: int, *, slots: int,
                 slot_size: int = 32 << 20, first_in_parent: bool = False) -> None:
        self.pipeline = pipeline
        self.workers = workers
        self._pid = os.getpid()
        self._closing = threading.Lock()
        self._closed = False
        self._procs: list = []
        # Each decoding process keeps its share of the decoded-chunk cache, so the pool holds
        # what the parent used to (the chunks a task wants are decoded where it runs).
        cache_bytes = pipeline.chunk_cache_bytes // max(1, workers)
        self._decoder = Decoder(cache_bytes)  # the inline worker's (workers == 0)
        # Records pulled out of large chunks for a horizon, for all workers at once (made
        # when first used: `runtime.horizons`), in place of their caches' shares.
        self.stash = StashFile(pipeline.chunk_cache_bytes)
        self.arena = Arena(slots, slot_size)
        self.transfers = {"in_slot": 0, "by_value": 0, "reruns": 0, "in_parent": 0}
        self._warming: threading.Thread | None = None
        self._spawn_error: OSError | None = None  # out of descriptors starting workers
        # With `first_in_parent`, until a worker is up (a new process's workers take a while:
        # the forkserver is a fresh interpreter), one task at a time runs on a thread of this
        # process instead, with the same code (`run_task`): the first batch need not wait.
        self._up = threading.Event()
        self._first: InlineExecutor | None = None
        self._first_busy = False
        # Off by default: a transform that crashes its process (a segfault in a C decoder,
        # os._exit) would take this one down instead of a worker (a clear WorkerError).
        self._first_in_parent = first_in_parent
        # workers="auto" tuned down to 0: every task runs on that thread of this process
        self.in_parent = False
        if workers == 0:
            self._executor: Any = InlineExecutor()
            _raise_malloc_thresholds()
            return
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
                initargs=(_pack_pipeline(pipeline), self._started, cache_bytes,
                          dict(os.environ)),
            )
        except BaseException:
            self.arena.close()
            raise
        track(self)

    def warm_up(self) -> None:
        """Start the worker processes now instead of on first use, on a thread, while the
        files open: the first one waits for the forkserver until it has loaded NumPy and
        the worker's code (started when the loader was made, or by `aioloader.warm_up()`:
        `aioloader.workers.procs`)."""
        if self.workers and self._warming is None:
            self._warming = threading.Thread(target=self._spawn, name="aioloader-spawn",
                                             daemon=True)
            self._warming.start()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Whether a worker process is up (and tasks go to the workers), waiting up to
        `timeout` s for one; True at once with workers=0."""
        return self.workers == 0 or self._up.wait(timeout)

    def all_started(self) -> bool:
        """Whether every worker process is up (at once with workers=0)."""
        if not self.workers:
            return True
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
        if self.workers:
            self.arena.grow(nbytes)

    async def run(self, task: Task, describe: str = "") -> Result:
        """Run one task; a batch comes back as views of its arena slot (see `Arena.lend`).
        A worker whose output did not fit its slot says how much it needs: the arena grows
        and the task runs again (its output is a pure function of the task)."""
        raws = task.raws
        room = True
        while True:
            result, here = await self._run_once(task, describe, room)
            if not result.needed:
                self.transfers["in_parent" if here else "by_value"
                               if result.slot < 0 and _has_arrays(result) else "in_slot"] += 1
                return result
            self.transfers["reruns"] += 1
            task.raws, task.raw_spans = raws, None
            try:
                self.arena.grow(result.needed)
            except OSError as exc:  # no memory file that large: this one goes by value
                log.warning("a task's output (%d bytes) cannot have a shared-memory slot "
                            "(%s); it comes through the pipe", result.needed, exc)
                room = False

    async def _run_once(self, task: Task, describe: str, room: bool
                        ) -> tuple[Result, bool]:
        """The result of one run of `task`, and whether it ran in this process."""
        here = self._inline_now()
        warming = self._warming
        if here is None and warming is not None and warming.is_alive():
            # Submitting now would wait, on the loop, for the spawning thread (it holds the
            # executor's lock until the forkserver is up): wait off the loop instead.
            await asyncio.get_running_loop().run_in_executor(None, warming.join)
        arena = self.arena
        if self.workers and task.raws is not None and room:
            with contextlib.suppress(OSError):  # (else they go through the pipe)
                arena.grow(input_bytes(task))
        slot = task.slot = arena.take() if room else -1
        lent = False
        cf = None
        try:
            if here is not None:
                where = arena.map_of(slot) if slot >= 0 else None
                cf = here.submit(run_task, task, self.pipeline, self._decoder, where,
                                 here is self._first, label=describe or f"task {task.task_id}")
                if here is self._first:
                    cf.add_done_callback(self._first_done)
            else:
                task.arena = arena.where(slot) if slot >= 0 else None
                if task.raws is not None:
                    ship_inputs(task, arena, slot)
                if self._spawn_error is not None:
                    raise self._spawn_error
                cf = self._executor.submit(run_task, task)
            # Shielded: cancelling a waiting task must not cancel `cf`, which races the
            # executor's own clean-up of a broken pool (CPython 3.11 then crashes its manager
            # thread and leaks the queue feeder); close() cancels what never started.
            wrapped = asyncio.wrap_future(cf)
            wrapped.add_done_callback(_retrieve)
            result = await asyncio.shield(wrapped)
            if here is None:
                self._up.set()
            if self.workers and self._unstarted:
                self._forget_names()
            if isinstance(result.payload, (Pickled, Blob)):
                result.payload = arena.unpickle(result.payload, slot)
            if result.slot >= 0 and result.payload is not None:
                result.payload = arena.lend(result.payload, result.slot)
                lent = True
            return result, here is not None
        except asyncio.CancelledError:
            if cf is not None and not cf.done():  # the worker still writes into the slot
                cf.add_done_callback(lambda _: arena.give(slot))
                slot = -1
            raise
        except WorkerError as exc:  # raised in the worker: say which task it was
            raise WorkerError(f"{describe or f'task {task.task_id}'}: {exc}") from None
        except BrokenProcessPool:
            raise WorkerError(
                f"a worker process died while processing {describe or f'task {task.task_id}'}"
                f"{self._exit_codes()}; the loader cannot continue (restart it from the last "
                "state; if a transform crashes the interpreter, run with workers=0 to debug)"
                f"{self._guard_hint}"
            ) from None
        finally:
            if not lent:
                arena.give(slot)

    def _inline_now(self) -> InlineExecutor | None:
        """The executor to run the next task in this process: always with workers=0, else
        while no worker is up yet and no other task runs here (see `_up`)."""
        if self.workers == 0:
            return self._executor
        if self.in_parent and not self._closed:
            self._first = self._first or InlineExecutor("aioloader-first-tasks")
            return self._first
        if not self._first_in_parent or self._up.is_set() or self._first_busy or self._closed:
            return None
        if self._first is None:
            self._first = InlineExecutor("aioloader-first-tasks")
        self._first_busy = True
        return self._first

    def _first_done(self, _: Any) -> None:
        self._first_busy = False

    def figures(self) -> dict[str, int]:
        """How workers' results came back: `in_slot` (shared memory, or small enough for the
        pipe), `by_value` (arrays through the pipe: no free slot),
        `reruns` (tasks run again after their output outgrew the slot), `in_parent` (tasks
        run in this process: while the workers started, or all with workers=0), `grown`
        (times the
        slots grew) and `slot_bytes` (a slot's size now)."""
        return {**self.transfers, "grown": self.arena.grown,
                "slot_bytes": self.arena.slot_size if self.arena.map is not None else 0}

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

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop the workers and free the arena. Tasks not started are dropped; a worker
        still busy after `grace` seconds (a transform that never returns) is terminated,
        then killed; with workers=0 its thread, which cannot be killed, is left running (a
        warning on the "aioloader" logger names the task). In a forked child only this
        process's copies are let go: the workers, queues and threads are the parent's."""
        with self._closing:  # at exit the main thread may close it while the loop's does
            if self._closed:
                return
            self._closed = True
            try:
                if self._pid == os.getpid():
                    self._stop_workers(grace)
            finally:
                self._decoder.close()
                self.arena.close()
                self.stash.close()

    def _stop_workers(self, grace: float) -> None:
        ex = self._executor
        if self._warming is not None:  # (it ends once the forkserver is up)
            self._warming.join()
        if not self.workers:
            stuck = ex.close(grace)
            # The arena is closed under a stuck thread all the same: a view it holds keeps
            # the map alive (close is then a no-op), and a closed map refuses access with
            # ValueError in that thread, never a crash.
            if stuck is not None:
                ops = [op.describe() for op in (*self.pipeline.record_ops,
                                                *self.pipeline.batch_ops)]
                log.warning(
                    "the inline worker (workers=0) is still running %s %.0f s after close: "
                    "a transform (%s) does not return; its thread is left behind (a daemon "
                    "thread: it does not keep the process from exiting)", stuck, grace,
                    " -> ".join(ops) or "none")
            return
        t0 = time.monotonic()
        procs = list((getattr(ex, "_processes", None) or {}).values()) if self.workers else []
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


def _has_arrays(result: Result) -> bool:
    return bool(array_leaves(result.payload))
