"""The ordered window of tasks: up to `depth` run at once, results come out in task order.

Whatever finishes first, task k's result is handed on before task k+1's: the output is a
pure function of the tasks, never of timing. A task's span (its output positions) is asked
for only when a place in the window is free, so the task size may grow as the run goes
(`Plan.task_size_goal`). The scheduler knows nothing of files, workers or batches: it runs
`run(k, lo, hi)` coroutines and is unit-tested with plain ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..io.gate import Gate

Span = Callable[[int], "tuple[int, int] | None"]  # task start -> [lo, hi), None at the end
Run = Callable[[int, int, int], Awaitable[Any]]  # (task number, lo, hi) -> result


class Scheduler:
    """Runs tasks over consecutive output spans from `start`, `depth` at a time."""

    def __init__(self, span: Span, run: Run, start: int, depth: int) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._span = span
        self._run = run
        self._start = start
        self._results: dict[int, tuple[int, int, asyncio.Future]] = {}
        self._consumed = 0
        self._end: int | None = None  # the number of tasks, once the spans ran out
        self._changed = asyncio.Event()
        self._room = Gate(depth)  # resizable: `set_depth`
        self._running: set[asyncio.Task] = set()
        self._producer = asyncio.ensure_future(self._produce())

    @property
    def depth(self) -> int:
        return self._room.limit

    def set_depth(self, depth: int) -> None:
        """Keep up to `depth` tasks in flight from now on (the autotuner's prefetch): more
        start at once; with fewer, new ones wait until enough results were taken."""
        self._room.resize(depth)

    @property
    def ready(self) -> int:
        """Results done and not yet taken (how far ahead the pipeline is)."""
        return sum(1 for *_, f in self._results.values() if f.done())

    async def _produce(self) -> None:
        loop = asyncio.get_running_loop()
        k, lo = 0, self._start
        try:
            while True:
                await self._room.acquire()
                span = self._span(lo)  # after the wait: the task size may have grown
                if span is None:
                    self._room.release()
                    self._end = k
                    return
                fut = loop.create_future()
                self._results[k] = (*span, fut)
                t = asyncio.ensure_future(self._one(k, *span, fut))
                self._running.add(t)
                t.add_done_callback(self._running.discard)
                self._changed.set()
                lo = span[1]
                k += 1
                # Not kept in this frame: cancelled while waiting for room, the frame lives
                # on in its error's traceback, a cycle that would hold the last task's
                # result (and the slot its batch is lent from) until the garbage collector
                # ran, after the loader closed.
                del fut, t
        finally:
            self._changed.set()

    async def _one(self, k: int, lo: int, hi: int, fut: asyncio.Future) -> None:
        try:
            fut.set_result(await self._run(k, lo, hi))
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
        finally:
            self._changed.set()

    async def next(self, keep: bool = False) -> tuple[int, int, Any] | None:
        """`(lo, hi, result)` of the next task in order; None after the last one. A task's
        error is raised here, in its turn. `keep`: the task keeps its place in the window
        until the caller gives it back (`give_back`), e.g. once a consumer took the result
        from a hand-off, so that what waits there counts as tasks ahead."""
        k = self._consumed
        while k not in self._results:
            if self._end is not None and k >= self._end:
                return None
            if self._producer.done() and not self._producer.cancelled() and \
                    self._producer.exception() is not None:
                raise self._producer.exception()  # type: ignore[misc]
            self._changed.clear()
            await self._changed.wait()
        lo, hi, fut = self._results[k]
        try:  # (shielded: a caller given up on, by a timeout or a cancel, leaves the task be)
            out = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.cancelled():  # the caller's cancel: the result is the next call's
                raise
            self._take(k)
            raise
        except BaseException:
            self._take(k)
            raise
        self._take(k, release=not keep)
        return lo, hi, out

    def _take(self, k: int, release: bool = True) -> None:
        """Task `k`'s result handed over (or its error raised): the next one is in turn."""
        self._results.pop(k, None)  # (gone already if the scheduler was cancelled)
        self._consumed += 1
        if release:
            self._room.release()

    def give_back(self) -> None:
        """A place a result taken with `keep` held: another task may start."""
        self._room.release()

    def cancel(self) -> list[asyncio.Task]:
        """Cancel everything in flight; returns the tasks to await (see `aclose`)."""
        pending = [self._producer, *self._running]
        for t in pending:
            if not t.done():
                t.cancel()
        for *_, fut in self._results.values():  # results nobody will read: don't log them
            if fut.done() and not fut.cancelled():
                fut.exception()
            else:
                fut.cancel()
        self._results.clear()
        return pending

    async def aclose(self) -> None:
        await asyncio.gather(*self.cancel(), return_exceptions=True)
