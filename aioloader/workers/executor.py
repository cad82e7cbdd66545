"""Where a task runs, as one interface: `Executor` (submit a task, get its result or its error;
how many run at once; close; the figures it reports), and `SlotExecutor`, what its
implementations here share: the process pool (`workers.pool`), threads of this process
(`workers.threads`) and workers=0 on one thread (`workers.inline`).

The runtime holds an `Executor` and never asks which it is: the tuner's worker count goes
to `set_workers` (the pool then runs tasks in this process at 0), and an executor that is
not a pool of processes (threads, remote actors) implements the same few methods. What is
shared is the way results come back: through an arena slot lent to the consumer, or by
value, and a task whose output outgrew its slot runs again once the arena has grown (its
output is a pure function of the task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from ..errors import WorkerError
from ..io.gate import Gate
from .arena import Arena, Blob, Pickled, array_leaves
from .decode import Decoder
from .extract import StashFile
from .messages import Pipeline, Result, Task

__all__ = ["CLOSE_GRACE_S", "Executor", "SlotExecutor", "gate_limit"]

log = logging.getLogger("aioloader")
CLOSE_GRACE_S = 2.0  # how long close() lets a busy worker finish before terminating it
_OPEN = contextlib.nullcontext()  # no gate (an async context manager too)


class Executor(Protocol):
    """Runs tasks somewhere; the scheduler and the task runner know it by this alone."""

    pipeline: Pipeline  # what every task runs
    stash: StashFile  # records pulled out of large chunks, for all tasks (`runtime.horizons`)
    cache_bytes: int  # the decoded-chunk cache of each process that decodes tasks
    # tasks one call to a worker carries at most (1: each task its own): the runtime keeps
    # this many times its prefetch in flight, so that a grouped call leaves as many calls
    # in flight as single tasks would. Optional: an executor without it counts as 1.
    tasks_per_call: int
    # whether every process that runs tasks can open this host's files (the spill of decoded
    # records, `workers.spill`, is one). Optional: an executor without it counts as False.
    spills: bool

    async def run(self, task: Task, describe: str = "") -> Result:
        """The task's result, or its error (a `WorkerError` naming `describe`)."""

    def admit(self) -> AbstractAsyncContextManager[Any]:
        """A turn to run a task: held around `run` by the task runner, so that no more tasks
        run at once than the tuner's worker count allows (open when not tuned)."""

    def set_workers(self, workers: int) -> None:
        """The tuner's worker count from now on (0: tasks run in this process)."""

    def settled(self) -> bool:
        """Whether the setting is in effect (its workers are up): a trial is judged then."""

    def warm_up(self) -> None:
        """Start what runs tasks now instead of on first use (returns at once)."""

    def reserve(self, nbytes: int) -> None:
        """A guess of a task's output size before the first one runs."""

    def figures(self) -> dict[str, int]:
        """How results came back (for `stats()`)."""

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop running tasks: those not started are dropped, a busy one gets `grace` s."""


def gate_limit(lanes: int, workers: int) -> int:
    """Tasks let at the pool for `lanes` busy workers of the `workers` started: `lanes` while
    some are to stay idle; with all of them in use, one more each, queued behind the task
    it runs, as without a gate (a worker that waits for its next task from this process
    idles for the round trip)."""
    if lanes < 1:  # one lane, a thread of this process
        return 1
    return lanes if lanes < workers else lanes + workers


def _retrieve(fut: asyncio.Future) -> None:
    """Mark a future's exception as seen (its waiter may have been cancelled)."""
    if not fut.cancelled():
        fut.exception()


class SlotExecutor:
    """What the executors here share: the arena slots results come back in, the stash,
    the decoder of tasks run in this process, the worker gate, and the rerun of a task
    whose output outgrew its slot. A subclass says how a task is submitted (`_submit`)."""

    tasks_per_call = 1  # each task is its own call
    spills = True  # (its workers are processes or threads of this host)

    def __init__(self, pipeline: Pipeline, workers: int, *, slots: int,
                 slot_size: int = 32 << 20, lanes: int | None = None) -> None:
        self.pipeline = pipeline
        self.workers = workers
        self._pid = os.getpid()
        self._closing = threading.Lock()
        self._closed = False
        # Each decoding process keeps its share of the decoded-chunk cache, so the executor
        # holds what the parent used to (the chunks a task wants are decoded where it runs).
        self.cache_bytes = pipeline.chunk_cache_bytes // max(1, workers)
        self._decoder = Decoder(self.cache_bytes)  # of the tasks run in this process
        # Records pulled out of large chunks for a horizon, for all workers at once (made
        # when first used: `runtime.horizons`), in place of their caches' shares.
        self.stash = StashFile(pipeline.chunk_cache_bytes)
        self.arena = Arena(slots, slot_size)
        self.transfers = {"in_slot": 0, "by_value": 0, "reruns": 0, "in_parent": 0}
        # workers="auto" (`lanes`: the tuner's first count): tasks let at the workers at
        # once, resized by the tuner; None: no gate
        self._gate = None if lanes is None else Gate(gate_limit(lanes, workers))

    def admit(self) -> AbstractAsyncContextManager[Any]:
        return self._gate or _OPEN

    def set_workers(self, workers: int) -> None:
        if self._gate is not None:
            self._gate.resize(gate_limit(workers, self.workers))

    def settled(self) -> bool:
        return self.all_started()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Whether a worker is up (and tasks go to the workers), waiting up to `timeout` s."""
        return True

    def all_started(self) -> bool:
        """Whether every worker is up."""
        return True

    def warm_up(self) -> None:
        pass

    def reserve(self, nbytes: int) -> None:
        pass

    async def run(self, task: Task, describe: str = "") -> Result:
        """Run one task; a batch comes back as views of its arena slot (see `Arena.lend`).
        A task whose output did not fit its slot says how much it needs: the arena grows
        and the task runs again."""
        raws = task.raws
        room = True
        while True:
            result, here = await self._run_once(task, describe or f"task {task.task_id}",
                                                room)
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
        route = await self._route(task, room)
        arena = self.arena
        slot = task.slot = arena.take() if room else -1
        lent = False
        cf = None
        try:
            cf, here = self._submit(task, slot, describe, route)
            # Shielded: cancelling a waiting task must not cancel `cf`, which races the
            # executor's own clean-up of a broken pool (CPython 3.11 then crashes its manager
            # thread and leaks the queue feeder); close() cancels what never started.
            wrapped = asyncio.wrap_future(cf)
            wrapped.add_done_callback(_retrieve)
            result = await asyncio.shield(wrapped)
            self._came_back(here)
            if isinstance(result.payload, (Pickled, Blob)):
                result.payload = arena.unpickle(result.payload, slot)
            if result.slot >= 0 and result.payload is not None:
                result.payload = arena.lend(result.payload, result.slot)
                lent = True
            return result, here
        except asyncio.CancelledError:
            if cf is not None and not cf.done():  # the worker still writes into the slot
                cf.add_done_callback(lambda _: arena.give(slot))
                slot = -1
            raise
        except WorkerError as exc:  # raised in the worker: say which task it was
            raise WorkerError(f"{describe}: {exc}") from None
        except BaseException as exc:
            failed = self._failed(exc, describe)
            if failed is exc:
                raise
            raise failed from None
        finally:
            if not lent:
                arena.give(slot)

    async def _route(self, task: Task, room: bool) -> Any:
        """Where `task` is to run (`_submit`'s `route`), decided before it takes a slot
        (`room`: whether it may have one)."""
        return None

    def _submit(self, task: Task, slot: int, describe: str, route: Any
                ) -> tuple[Future, bool]:
        """Start `task` with output slot `slot` (-1: none) where `route` says; its future,
        and whether it runs in this process."""
        raise NotImplementedError

    def _came_back(self, here: bool) -> None:
        """A result came back (from this process if `here`)."""

    def _failed(self, exc: BaseException, describe: str) -> BaseException:
        """The error to raise for `exc`, raised running `describe` (`exc` itself if it is
        to go as it is)."""
        return exc

    def figures(self) -> dict[str, int]:
        """How results came back: `in_slot` (shared memory, or small enough for the pipe),
        `by_value` (arrays through the pipe: no free slot), `reruns` (tasks run again after
        their output outgrew the slot), `in_parent` (tasks run in this process: while the
        workers started, or all with workers=0), `grown` (times the slots grew) and
        `slot_bytes` (a slot's size now)."""
        return {**self.transfers, "grown": self.arena.grown,
                "slot_bytes": self.arena.slot_size if self.arena.map is not None else 0}

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop running tasks (`_stop`) and free the arena. In a forked child only this
        process's copies are let go: the workers, queues and threads are the parent's."""
        with self._closing:  # at exit the main thread may close it while the loop's does
            if self._closed:
                return
            self._closed = True
            try:
                if self._pid == os.getpid():
                    self._stop(grace)
            finally:
                self._decoder.close()
                self.arena.close()
                self.stash.close()

    def _stop(self, grace: float) -> None:
        """Drop the tasks not started; give those running `grace` s, then stop them."""


def _has_arrays(result: Result) -> bool:
    return bool(array_leaves(result.payload))
