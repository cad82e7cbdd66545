"""One stage's and one transform's figures: how many items, how long, how busy.

`StageStats` is the hook a component times its own work with (`with stage.timed():`,
`begin()`/`end()`, or `add(items, seconds)` for work timed elsewhere, as a worker's task
reports it); busy is per core, so a stage done by N processes, or with many calls in flight
on one event loop, reads at most 100%. `OpStats` sums one transform's figures, task by task.
`runtime.stats` gathers them into a pipeline's figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .trace import Trace

Clock = Callable[[], float]
PROCESS = "decode+transform"  # the workers' stage; transforms are shown under it


class Call:
    """One timed call of `StageStats.timed()`; set `items` when the count is known late."""

    __slots__ = ("items",)

    def __init__(self, items: int) -> None:
        self.items = items


class StageStats:
    """One stage: items done, time taken (total, per item, longest call), calls in flight.

    `cores` is how many processes share the stage's work (the workers, for decode+transform):
    busy time is divided by it. Calls timed here (begin/end) count as busy while at least
    one is in flight, at most `cores` at once, so overlapping awaits are not summed; figures
    from `add()` were measured where the work ran and count as they are.
    """

    def __init__(self, name: str, cores: int = 1, unit: str = "workers",
                 clock: Clock = time.perf_counter) -> None:
        self.name = name
        self.cores = max(1, cores)
        self.unit = unit  # what the cores are called in the table ("95% of 2 workers")
        self.clock = clock
        self.count = 0  # items done
        self.calls = 0
        self.total = 0.0  # seconds, summed over calls (concurrent calls overlap)
        self.max = 0.0  # the longest single call
        self.in_flight = 0
        self.peak_in_flight = 0
        self._occupied = 0.0  # core-seconds of begin/end calls, at most `cores` at once
        self._added = 0.0  # seconds reported by add()
        self._mark = 0.0  # when _occupied was last brought up to date
        self.trace: Trace | None = None  # where spans go when tracing (`runtime.trace`)

    def __repr__(self) -> str:
        return (f"StageStats({self.name!r}, count={self.count}, total={self.total:.3f}, "
                f"max={self.max:.3f}, in_flight={self.in_flight})")

    # -- the hook ---------------------------------------------------------------------

    def begin(self) -> float:
        """Start a call; pass the returned time to `end()`."""
        now = self.clock()
        self._advance(now)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        return now

    def end(self, t0: float, items: int = 1) -> None:
        """Finish the call started at `t0`, which did `items` items."""
        now = self.clock()
        self._advance(now)
        self.in_flight -= 1
        self._record(items, now - t0)
        if self.trace is not None:
            self.trace.stage(self.name, t0, now, items)

    @contextmanager
    def timed(self, items: int = 1) -> Iterator[Call]:
        """Time the block as one call (counted also when it raises, as begin/end pairs in
        `try/finally` do); `as call` lets the block set `call.items` once it knows."""
        call = Call(items)
        t0 = self.begin()
        try:
            yield call
        finally:
            self.end(t0, call.items)

    def add(self, items: int, seconds: float) -> None:
        """A call timed elsewhere (in a worker process): `items` items in `seconds`."""
        self._record(items, seconds)
        self._added += seconds

    def _record(self, items: int, seconds: float) -> None:
        self.count += items
        self.calls += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def _advance(self, now: float) -> None:
        if self.in_flight:
            self._occupied += (now - self._mark) * min(self.in_flight, self.cores)
        self._mark = now

    # -- figures ----------------------------------------------------------------------

    @property
    def mean(self) -> float:
        """Seconds per item."""
        return self.total / self.count if self.count else 0.0

    def busy_seconds(self) -> float:
        """Core-seconds spent so far (calls still in flight count up to now)."""
        open_ = (self.clock() - self._mark) * min(self.in_flight, self.cores) \
            if self.in_flight else 0.0
        return self._occupied + open_ + self._added

    def busy_fraction(self, elapsed: float) -> float:
        """Share of `elapsed` x `cores` the stage was busy: at most 1 when timed here."""
        return self.busy_seconds() / (elapsed * self.cores) if elapsed > 0 else 0.0

    def as_dict(self, elapsed: float) -> dict[str, Any]:
        return {"items": self.count, "calls": self.calls, "total_s": self.total,
                "mean_s": self.mean, "max_s": self.max,
                "busy_s": self.total,  # the name before busy was per core; = total_s
                "busy_fraction": self.busy_fraction(elapsed), "cores": self.cores,
                "in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight}

    # the names before count/total
    items = property(lambda self: self.count)
    seconds = property(lambda self: self.total)


class OpStats:
    """One transform (map, filter, random_map, a map after batch) over all tasks."""

    __slots__ = ("count", "max", "name", "stage", "tasks", "total")

    def __init__(self, name: str, stage: str = PROCESS) -> None:
        self.name = name
        self.stage = stage  # the stage row it is shown under
        self.count = 0  # items that went in
        self.tasks = 0
        self.total = 0.0
        self.max = 0.0  # the most one task spent in it

    @property
    def mean(self) -> float:
        """Seconds per item."""
        return self.total / self.count if self.count else 0.0

    def merge(self, items: int, seconds: float) -> None:
        self.count += items
        self.tasks += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def as_dict(self, elapsed: float, cores: int) -> dict[str, Any]:
        return {"stage": self.stage, "items": self.count, "tasks": self.tasks,
                "total_s": self.total, "mean_s": self.mean, "max_s": self.max,
                "busy_fraction": self.total / (elapsed * cores) if elapsed > 0 else 0.0}
