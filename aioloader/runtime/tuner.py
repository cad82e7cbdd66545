"""The running half of autotune: measure each interval, ask `aioloader.runtime.autotune`, apply.

A task on the loader's loop wakes every `INTERVAL` s once the first batch is out (the start
is all waiting, and says nothing about the steady state), turns the stage figures' changes
since the last look into an `Observation` (the consumer's waiting, the decode stage's busy
time, the read slots' occupancy, this process's CPU, the machine's idle cores and CPU
pressure: `runtime.cpuload`), and hands a new `Setting` to `apply`
(the loader's: the worker gate, the scheduler's depth, storage's request limit).

A step up in workers or in io_concurrency is a trial (tf.data's hill climbing): it is taken
only once the current setting has a measured rate — batches delivered, over `MIN_BATCHES`,
for workers; reads completed, over `MIN_READS`, for io_concurrency — and judged once as
many came after it (one interval left out to settle, and the time workers take to start
the first time: `settled`). `autotune.better` keeps it, or it is undone and that limit
comes down to where it was: more workers than pay for their process hop, or more requests
in flight than the store serves faster, are not tried again. Prefetch grows freely.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from .autotune import (
    GAIN,
    GAIN_IO,
    LOW_MEMORY,
    Limits,
    Observation,
    Setting,
    better,
    decide,
    memory_free,
)
from .cpuload import idle_seconds, stall_seconds

log = logging.getLogger("aioloader")

INTERVAL = 0.2  # seconds between looks
MIN_BATCHES = 8  # batches a rate is measured over, before and after a worker step (and at
TASKS = 4  # least this many tasks' worth: a task may carry several batches)
MIN_READS = 1024  # reads a rate is measured over, before and after an io step
MIN_TIMED = 32  # reads an interval's time per read is taken over
MAX_TRIAL_S = 3.0  # a trial is judged after this long whatever was delivered
HISTORY = 64  # changes kept for stats()


class Sample(NamedTuple):
    t: float
    wait: float  # the consumer's waiting, seconds so far
    busy: float  # seconds the decode lanes ran tasks so far
    cpu: float  # this process's CPU seconds so far
    io: float  # request-seconds in flight so far
    batches: int  # delivered so far
    reads: int  # completed by storage so far
    idle: float | None = None  # CPU-seconds the machine's cores (ours) were idle so far
    stall: float | None = None  # seconds some runnable task waited for a CPU so far


class Tuner:
    """Tunes `setting` within `limits` from `stats` (a `PipelineStats`) while it runs."""

    def __init__(self, setting: Setting, limits: Limits, stats: Any, cores: int,
                 apply: Callable[[Setting], None],
                 io_held: Callable[[], float] | None = None,
                 memory: Callable[[], float] = memory_free,
                 cpu: Callable[[], float] = time.process_time,
                 settled: Callable[[], bool] = lambda: True,
                 reads: Callable[[], int] = lambda: 0,
                 base_rtt: Callable[[], float | None] = lambda: None,
                 idle: Callable[[], float | None] = idle_seconds,
                 stall: Callable[[], float | None] = stall_seconds) -> None:
        self.setting, self.limits, self.stats, self.cores = setting, limits, stats, cores
        self._apply, self._io_held, self._memory, self._cpu = apply, io_held, memory, cpu
        self._settled = settled  # whether a new setting is in effect (workers started)
        self._reads = reads
        self._base_rtt = base_rtt  # the store's least median time to an answer (storage's)
        self._idle, self._stall = idle, stall  # the machine's (`runtime.cpuload`)
        self._settle = 1  # looks left before measuring a new setting
        self.history: list[tuple[float, Setting]] = []  # (elapsed s, setting) per change
        self.looks = 0
        self.undone = 0  # worker steps that did not pay
        self._last: Sample | None = None  # the previous look
        # the least time per read seen in an interval, or the store's base round trip
        self.read_floor: float | None = None
        self._since: Sample | None = None  # the first look at the current setting
        # (what is tried: "workers" or "io_concurrency", the rate before, the setting before)
        self._trial: tuple[str, float, Setting] | None = None
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
        return Sample(time.perf_counter(), st.wait_seconds, st.task_seconds,
                      self._cpu(), self._io_held() if self._io_held is not None else 0.0,
                      st.batches, self._reads(), self._idle(), self._stall())

    def observe(self, before: Sample, after: Sample) -> Observation:
        """The interval between two samples, as the controller sees it (and the least time
        per read so far: `read_floor`)."""
        dt = max(after.t - before.t, 1e-6)
        s = self.setting
        lanes = max(1, s.workers)  # at 0, decoding runs on one thread of this process
        busy = (after.busy - before.busy) / (dt * lanes)
        reads = after.reads - before.reads
        per_read = (after.io - before.io) / reads if reads >= MIN_TIMED else None
        for floor in (per_read, self._base_rtt()):
            if floor is not None and (self.read_floor is None or floor < self.read_floor):
                self.read_floor = floor
        free = self.cores - (after.cpu - before.cpu) / dt - busy * s.workers
        if after.idle is not None and before.idle is not None:  # a competing load's share
            free = min(free, (after.idle - before.idle) / dt)
        stalled = (0.0 if after.stall is None or before.stall is None
                   else min(1.0, max(0.0, (after.stall - before.stall) / dt)))
        return Observation(wait_fraction=(after.wait - before.wait) / dt,
                           process_busy=busy,
                           io_busy=(after.io - before.io) / (dt * s.io_concurrency),
                           cores_free=free, memory_free=self._memory(),
                           read_seconds=per_read, read_floor=self.read_floor,
                           cpu_pressure=stalled)

    def look(self, now: Sample) -> None:
        """One interval ending at `now`: judge a trial, or decide and apply."""
        self.looks += 1
        last, self._last = self._last, now
        if last is None or self._since is None:  # settle: workers up, then one more look
            if self._settled():
                self._settle -= 1
                if self._settle <= 0:
                    self._since = now
            return
        since = self._since
        if self._trial is not None:
            what = self._trial[0]
            if self._measured(what, since, now) or now.t - since.t >= MAX_TRIAL_S:
                self._judge(_rate(what, since, now))
            return
        s = self.setting
        obs = self.observe(last, now)
        log.debug("autotune: waited %.2f, decode busy %.2f, read slots %.2f, %s ms a read "
                  "(floor %s), cores free %.2f, CPU pressure %.2f", obs.wait_fraction,
                  obs.process_busy, obs.io_busy, _ms(obs.read_seconds), _ms(obs.read_floor),
                  obs.cores_free, obs.cpu_pressure)
        nxt = decide(s, obs, self.limits)
        for what in ("io_concurrency", "workers"):  # one trial at a time
            up = getattr(nxt, what) > getattr(s, what)
            idle = (what == "workers" and nxt.workers < s.workers
                    and obs.memory_free >= LOW_MEMORY)  # (a squeeze is obeyed, not tried)
            if up or idle:
                if self._measured(what, since, now) and self._trial is None:
                    self._trial = (what, _rate(what, since, now), s)
                else:  # no baseline yet (or another trial): the others may move meanwhile
                    nxt = replace(nxt, **{what: getattr(s, what)})
        if nxt != s:  # (prefetch alone moves the rates little: it keeps the baseline)
            self._change(nxt, remeasure=replace(nxt, prefetch=s.prefetch) != s)

    def _measured(self, what: str, a: Sample, b: Sample) -> bool:
        """Whether enough happened between two samples to rate a setting of `what`."""
        if what == "io_concurrency":
            return b.reads - a.reads >= MIN_READS
        most = max(MIN_BATCHES, TASKS * getattr(self.stats, "batches_per_task", 1))
        return b.batches - a.batches >= most

    def _judge(self, after: float) -> None:
        assert self._trial is not None
        what, before, prev = self._trial
        self._trial = None
        back = getattr(prev, what)
        down = getattr(self.setting, what) < back
        gain = GAIN_IO if what == "io_concurrency" else GAIN
        if (not better(after, before, gain)) if down else better(before, after, gain):
            return  # a step up that paid, or a step down that cost nothing
        self.undone += 1
        log.debug("autotune: %s=%d gave %.1f/s against %.1f/s at %d: back", what,
                  getattr(self.setting, what), after, before, back)
        # not tried again: the bound comes to where it was
        bound = "min_workers" if down else what
        self.limits = replace(self.limits, **{bound: back})
        self._change(replace(self.setting, **{what: back}))

    def step(self, obs: Observation) -> bool:
        """Decide from `obs` and apply at once, without a trial (tests drive it so); whether
        the setting changed."""
        nxt = decide(self.setting, obs, self.limits)
        if nxt != self.setting:
            self._change(nxt)
        return nxt != self.setting

    def _change(self, nxt: Setting, remeasure: bool = True) -> None:
        log.debug("autotune: %s -> %s", self.setting, nxt)
        self.setting = nxt
        self._apply(nxt)
        self.history.append((round(self.stats.elapsed, 3), nxt))
        del self.history[:-HISTORY]
        if remeasure:  # measure the new setting after it settled
            self._since, self._settle = None, 2

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


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.0f}"


def _count(what: str, s: Sample) -> int:
    return s.reads if what == "io_concurrency" else s.batches


def _rate(what: str, a: Sample, b: Sample) -> float:
    """Reads completed (io_concurrency) or batches delivered (workers) per second."""
    return (_count(what, b) - _count(what, a)) / max(b.t - a.t, 1e-6)
