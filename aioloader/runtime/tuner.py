"""The running half of autotune: measure each interval, ask `aioloader.autotune.decide`, apply.

A task on the loader's loop wakes every `INTERVAL` s once the first batch is out (the start
is all waiting, and says nothing about the steady state), turns the stage figures' changes
since the last look into an `Observation` (the consumer's waiting, the decode workers'
busy time, the read slots' occupancy, this process's CPU), and hands a new `Setting` to
`apply` (the loader's: the worker gate, the scheduler's depth, storage's request limit).
After a change it measures afresh, so each decision sees the setting it judges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ..autotune import Limits, Observation, Setting, decide, memory_free

log = logging.getLogger("aioloader")

INTERVAL = 0.1  # seconds between looks
HISTORY = 64  # changes kept for stats()


class Tuner:
    """Tunes `setting` within `limits` from `stats` (a `PipelineStats`) while it runs."""

    def __init__(self, setting: Setting, limits: Limits, stats: Any, cores: int,
                 apply: Callable[[Setting], None],
                 io_held: Callable[[], float] | None = None,
                 memory: Callable[[], float] = memory_free,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self.setting, self.limits, self.stats, self.cores = setting, limits, stats, cores
        self._apply, self._io_held, self._memory, self._cpu = apply, io_held, memory, cpu
        self.history: list[tuple[float, Setting]] = []  # (elapsed s, setting) per change
        self.looks = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None and self.limits.tune:
            self._task = asyncio.ensure_future(self._run())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _sample(self) -> tuple[float, float, float, float, float]:
        st = self.stats
        return (time.perf_counter(), st.wait_seconds, st.process.busy_seconds(), self._cpu(),
                self._io_held() if self._io_held is not None else 0.0)

    def observe(self, before: tuple, after: tuple) -> Observation:
        """The interval between two samples, as the controller sees it."""
        dt = max(after[0] - before[0], 1e-6)
        s = self.setting
        busy = (after[2] - before[2]) / (dt * max(1, s.workers))
        parent = (after[3] - before[3]) / dt
        return Observation(wait_fraction=(after[1] - before[1]) / dt,
                           process_busy=busy,
                           io_busy=(after[4] - before[4]) / (dt * s.io_concurrency),
                           cores_free=self.cores - parent - busy * s.workers,
                           memory_free=self._memory())

    def step(self, obs: Observation) -> bool:
        """Decide from `obs` and apply the result; whether the setting changed."""
        self.looks += 1
        nxt = decide(self.setting, obs, self.limits)
        if nxt == self.setting:
            return False
        log.debug("autotune: %s -> %s (%s)", self.setting, nxt, obs)
        self.setting = nxt
        self._apply(nxt)
        self.history.append((round(self.stats.elapsed, 3), nxt))
        del self.history[:-HISTORY]
        return True

    async def _run(self) -> None:
        before = None
        while True:
            await asyncio.sleep(INTERVAL)
            if self.stats.first_batch_seconds is None:
                continue
            now = self._sample()
            if before is not None and self.step(self.observe(before, now)):
                now = self._sample()  # measure the new setting from here
            before = now

    def figures(self) -> dict[str, Any]:
        """For `stats().as_dict()["autotune"]`: the values now, what is tuned, the changes."""
        s = self.setting
        return {"workers": s.workers, "prefetch": s.prefetch,
                "io_concurrency": s.io_concurrency, "tuned": sorted(self.limits.tune),
                "looks": self.looks,
                "changes": [{"at_s": t, "workers": c.workers, "prefetch": c.prefetch,
                             "io_concurrency": c.io_concurrency} for t, c in self.history]}
