"""The inline worker (`workers=0`): tasks run one at a time on a daemon thread of this process
(`Inline`, an `Executor`; the pool runs tasks in this process on the same kind of thread, and
the threads executor, `workers.threads`, on several that share one queue: `InlineExecutor`).

Not a `ThreadPoolExecutor`: concurrent.futures joins its threads at interpreter exit, so a
transform that never returns would keep the process from ever exiting, whatever Ctrl-C does.
A daemon thread is not waited for at exit. A thread cannot be killed either, so `close` waits
a grace period for the task it runs and then leaves the thread behind, stuck, and says which
task it was (the caller logs it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .executor import SlotExecutor
from .messages import Pipeline, Task
from .worker import _raise_malloc_thresholds, run_task

log = logging.getLogger("aioloader")


class InlineExecutor:
    """Runs submitted calls on `threads` daemon threads that take them in order from one
    queue (started on the first submit, or by `start`): with one thread, one at a time."""

    def __init__(self, name: str = "aioloader-inline", threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"an inline executor has at least one thread, got {threads}")
        self._name = name
        self._count = threads
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._running: dict[int, str] = {}  # a thread's ident -> the label of its call

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads started (none before the first submit or `start`)."""
        return list(self._threads)

    def start(self) -> None:
        """Start the threads now (a no-op once started, or after `close`)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._threads or self._closed:
            return
        for k in range(self._count):
            name = self._name if self._count == 1 else f"{self._name}-{k}"
            thread = threading.Thread(target=self._work, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, fn: Callable[..., Any], /, *args: Any, label: str = "") -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a task after the inline worker was closed")
            self._start()
            self._queue.put((fut, fn, args, label))
        return fut

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, label = item
            del item
            if fut.set_running_or_notify_cancel():
                self._running[me] = label
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # the caller's to see, as from an executor
                    fut.set_exception(exc)
                finally:
                    del self._running[me]
            del fut, fn, args

    def close(self, grace: float) -> str | None:
        """Cancel the calls not started and wait up to `grace` s (for all threads together)
        for the running ones; None when every thread ended, else the labels of the calls
        still running (their threads are left behind: daemons, they do not hold up the
        interpreter's exit)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        deadline = time.monotonic() + grace
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [self._running.get(t.ident or 0) or "a task" for t in threads if t.is_alive()]
        return ", ".join(stuck) if stuck else None


def warn_stuck(who: str, stuck: str, grace: float, pipeline: Pipeline) -> None:
    """Say that `who`, a thread of this process, is still running task `stuck` `grace` s
    after close, and which transforms it runs: it is left behind (a thread cannot be
    stopped)."""
    ops = [op.describe() for op in (*pipeline.record_ops, *pipeline.batch_ops)]
    log.warning("%s is still running %s %.0f s after close: a transform (%s) does not "
                "return; its thread is left behind (a daemon thread: it does not keep the "
                "process from exiting)", who, stuck, grace, " -> ".join(ops) or "none")


class Inline(SlotExecutor):
    """workers=0: every task runs on one daemon thread of this process, with the code a worker
    runs (`run_task`), its output stacked in an arena slot as a worker's would be. `close`
    leaves a task that never returns behind on its thread, with a warning naming it."""

    def __init__(self, pipeline: Pipeline, *, slots: int, slot_size: int = 32 << 20,
                 lanes: int | None = None) -> None:
        super().__init__(pipeline, 0, slots=slots, slot_size=slot_size, lanes=lanes)
        self._thread = InlineExecutor()
        _raise_malloc_thresholds()

    def _submit(self, task: Task, slot: int, describe: str, route: Any
                ) -> tuple[Future, bool]:
        where = self.arena.map_of(slot) if slot >= 0 else None
        return self._thread.submit(run_task, task, self.pipeline, self._decoder, where, False,
                                   label=describe), True

    def _stop(self, grace: float) -> None:
        stuck = self._thread.close(grace)
        # The arena is closed under a stuck thread all the same: a view it holds keeps
        # the map alive (close is then a no-op), and a closed map refuses access with
        # ValueError in that thread, never a crash.
        if stuck is not None:
            warn_stuck("the inline worker (workers=0)", stuck, grace, self.pipeline)
