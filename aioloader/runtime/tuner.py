"""The running half of autotune: measure each interval, ask `aioloader.autotune`, apply.

A task on the loader's loop wakes every `INTERVAL` s once the first batch is out (the start
is all waiting, and says nothing about the steady state), turns the stage figures' changes
since the last look into an `Observation` (the consumer's waiting, the decode stage's busy
time, the read slots' occupancy, this process's CPU), and hands a new `Setting` to `apply`
(the loader's: the worker gate, the scheduler's depth, storage's request limit).

A step up in workers is a trial: it is taken only after `MIN_BATCHES` batches were
delivered at the current setting (their rate is the baseline), and judged once as many
were delivered after it (one interval left out to settle); `autotune.better` keeps it, or
it is undone and the workers' limit comes down to where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from ..autotune import Limits, Observation, Setting, better, decide, memory_free

log = logging.getLogger("aioloader")

INTERVAL = 0.2  # seconds between looks
MIN_BATCHES = 8  # batches a rate is measured over, before and after a worker step
MAX_TRIAL_S = 3.0  # a trial is judged after this long whatever was delivered
HISTORY = 64  # changes kept for stats()


class Sample(NamedTuple):
    t: float
    wait: float  # the consumer's waiting, seconds so far
    busy: float  # the decode stage's busy seconds so far
    cpu: float  # this process's CPU seconds so far
    io: float  # request-seconds in flight so far
    batches: int  # delivered so far


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
        self.undone = 0  # worker steps that did not pay
        self._last: Sample | None = None  # the previous look
        self._since: Sample | None = None  # the first look at the current setting
        self._trial: tuple[float, Setting] | None = None  # (rate before, setting before)
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

    def sample(self) -> Sample:
        st = self.stats
        return Sample(time.perf_counter(), st.wait_seconds, st.process.busy_seconds(),
                      self._cpu(), self._io_held() if self._io_held is not None else 0.0,
                      st.batches)

    def observe(self, before: Sample, after: Sample) -> Observation:
        """The interval between two samples, as the controller sees it."""
        dt = max(after.t - before.t, 1e-6)
        s = self.setting
        lanes = max(1, s.workers)  # at 0, decoding runs on one thread of this process
        busy = (after.busy - before.busy) / (dt * lanes)
        return Observation(wait_fraction=(after.wait - before.wait) / dt,
                           process_busy=busy,
                           io_busy=(after.io - before.io) / (dt * s.io_concurrency),
                           cores_free=self.cores - (after.cpu - before.cpu) / dt
                           - busy * s.workers,
                           memory_free=self._memory())

    def look(self, now: Sample) -> None:
        """One interval ending at `now`: judge a trial, or decide and apply."""
        self.looks += 1
        last, self._last = self._last, now
        if last is None or self._since is None:  # the first look at this setting: settle
            self._since = now
            return
        since = self._since
        enough = now.batches - since.batches >= MIN_BATCHES
        if self._trial is not None:
            if enough or now.t - since.t >= MAX_TRIAL_S:
                self._judge(_rate(since, now))
            return
        nxt = decide(self.setting, self.observe(last, now), self.limits)
        if nxt.workers > self.setting.workers:
            if enough:
                self._trial = (_rate(since, now), self.setting)
            else:  # no baseline yet: the other settings may move meanwhile
                nxt = replace(nxt, workers=self.setting.workers)
        if nxt != self.setting:
            self._change(nxt)

    def _judge(self, after: float) -> None:
        assert self._trial is not None
        before, prev = self._trial
        self._trial = None
        if better(before, after):
            return
        self.undone += 1
        log.debug("autotune: %d workers delivered %.1f batches/s against %.1f at %d: back",
                  self.setting.workers, after, before, prev.workers)
        self.limits = replace(self.limits, workers=prev.workers)  # not tried again
        self._change(replace(self.setting, workers=prev.workers))

    def step(self, obs: Observation) -> bool:
        """Decide from `obs` and apply at once, without a trial (tests drive it so); whether
        the setting changed."""
        nxt = decide(self.setting, obs, self.limits)
        if nxt != self.setting:
            self._change(nxt)
        return nxt != self.setting

    def _change(self, nxt: Setting) -> None:
        log.debug("autotune: %s -> %s", self.setting, nxt)
        self.setting = nxt
        self._apply(nxt)
        self.history.append((round(self.stats.elapsed, 3), nxt))
        del self.history[:-HISTORY]
        self._since = None  # measure the new setting after one interval to settle

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL)
            if self.stats.first_batch_seconds is not None:
                self.look(self.sample())

    def figures(self) -> dict[str, Any]:
        """For `stats().as_dict()["autotune"]`: the values now, what is tuned, the changes."""
        s = self.setting
        return {"workers": s.workers, "prefetch": s.prefetch,
                "io_concurrency": s.io_concurrency, "tuned": sorted(self.limits.tune),
                "looks": self.looks, "undone": self.undone,
                "changes": [{"at_s": t, "workers": c.workers, "prefetch": c.prefetch,
                             "io_concurrency": c.io_concurrency} for t, c in self.history]}


def _rate(a: Sample, b: Sample) -> float:
    """Batches delivered per second between two samples."""
    return (b.batches - a.batches) / max(b.t - a.t, 1e-6)
