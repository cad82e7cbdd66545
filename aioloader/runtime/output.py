"""The run's output in order, each item with the loader state after it.

A run is the scheduler's ordered task results turned into what the consumer gets: in batch
mode the finished batches of each result (several per task once tasks grow), in stream mode
what the `Assembler` makes of consecutive windows. Either way an item leaves here with the
`LoaderState` after it, which the loader makes the consumer's state when the item is handed
out (`Loader._deliver`), and nowhere else.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from ..describe.state import LoaderState
from .assembly import Assembler
from .scheduler import Scheduler
from .tasks import TaskRunner


class Run:
    """One run of the runner's plan from a start state: a scheduler and what turns its results
    into items. Restarting (set_state) makes a new run."""

    def __init__(self, runner: TaskRunner, start: LoaderState, depth: int, dataset: Any,
                 stats: Any) -> None:
        plan = runner.plan
        self.runner = runner
        self._stats = stats
        self.start = start
        # From a bucket the first task runs alone: the others' reads (hundreds of GETs
        # each, record by record) would share this process's CPU and the connections with
        # its reads, and the first batch is the one a job waits for. The depth opens once
        # it is out (`_opened`).
        # (Batch mode: a stream's assembler takes tasks itself.)
        alone = plan.batch_mode and not runner.local and depth > 1
        self._depth = depth if alone else 0
        self.scheduler = Scheduler(runner.span, runner.run, start.position,
                                   1 if alone else depth)
        self._ready: collections.deque = collections.deque()  # batch mode: (batch, position)
        self._assembler = None if plan.batch_mode else Assembler(
            dataset.batching, dataset.pack_batch, dataset.batch_ops,
            {"position": start.position, "skip": start.skip, "rows": start.rows,
             "buckets": start.buckets},
            _next_task(self.scheduler, runner), stats.assemble, plan.unit, plan.restarts,
            plan.cuts)

    @property
    def ready(self) -> int:
        return self.scheduler.ready + len(self._ready)

    async def next(self, keep: bool = False) -> tuple[Any, LoaderState, Callable[[], None] | None]:
        """The next item, the state after it, and (with `keep`, batch mode) what to call once
        a consumer took it from a hand-off: till then its task keeps its place among the
        `prefetch` ahead (`Scheduler.next`), so what waits in the sync iterator's hand-off
        counts as ahead of the consumer, not on top. StopAsyncIteration after the last. The
        consumer's wait is timed (`PipelineStats.note_batch`)."""
        ready, t0 = self.scheduler.ready, time.perf_counter()
        item = await self._next(keep)
        now = time.perf_counter()  # (the stats' clock)
        self._stats.note_batch(now - t0, ready, now)
        return item

    async def _next(self, keep: bool) -> tuple[Any, LoaderState, Callable[[], None] | None]:
        if self._assembler is not None:
            out, at = await self._assembler.next()
            return out, self.start.at(at["position"], at["skip"], at["rows"],
                                      at.get("until", 0), tuple(at.get("buckets", ()))), None
        while not self._ready:
            item = await self.scheduler.next(keep)
            self._opened()
            if item is None:
                raise StopAsyncIteration
            lo, _, result = item
            self.runner.observe(result.payload, result.largest)
            unit = self.runner.plan.unit
            batches = result.payload or ()
            if keep and not batches:
                self.scheduler.give_back()
            for j, batch in enumerate(batches):  # (the task's place: with its first batch)
                self._ready.append((batch, lo + (j + 1) * unit, keep and j == 0))
        batch, position, held = self._ready.popleft()
        return batch, self.start.at(position), self.scheduler.give_back if held else None

    def _opened(self) -> None:
        """After the first task: the depth asked for (unless the tuner set one meanwhile)."""
        if self._depth:
            if self.scheduler.depth == 1:
                self.scheduler.set_depth(self._depth)
            self._depth = 0

    async def aclose(self) -> None:
        if self._assembler is not None:
            self._assembler.close()
        await self.scheduler.aclose()
        self._ready.clear()  # lent batches nobody took: their slots (and memory) go now,
        # not when the garbage collector finds this run


def _next_task(scheduler: Scheduler, runner: TaskRunner):
    """Stream mode: a function giving the next task's first position and what its worker
    sent (`workers.pieces`), or None after the last; tasks grow as batches' tasks do. Not
    a method: the assembler holding it must not keep the run alive (a run dropped by
    set_state then goes at once, and its assembler's thread with it)."""

    async def next_task() -> tuple[int, int, Any, Any] | None:
        item = await scheduler.next()
        if item is None:
            return None
        lo, hi, result = item
        runner.observe([result.payload])
        return lo, hi, result.payload, result.survivors

    return next_task
