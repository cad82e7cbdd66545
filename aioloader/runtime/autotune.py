"""The autotune controller: from measured stage rates, the next workers/prefetch/io_concurrency.

Pure: `decide(setting, observation, limits)` is a function of numbers, property-tested; the
runtime (`aioloader.runtime.tuner`) measures, calls it a few times a second and applies the
result. Only settings given as "auto" move (`Limits.tune`).

The rules follow tf.data's AUTOTUNE and Grain's `pick_performance_config` in spirit, not in
code. Nothing grows unless the consumer waited (`wait_fraction`). Workers grow by one while
decode is busy and a core is free, and one is given back while they idle; io_concurrency
doubles while its slots are full and reads are answered about as fast as with little queued
(`read_floor`: by Little's law the rate then doubles too); prefetch grows by one while the
consumer waits (while decoding is not the limit, a core is free, or the machine is
`CONTENDED`); under memory pressure (`LOW_MEMORY`) each moves down and nothing grows. Each
step up is a trial that `better` keeps only if delivery rises. docs/performance.md ("How
auto decides") gives each rule with the measurements behind it.

Beside a competing load (`Observation.cpu_pressure`, `cores_free` counting the machine's idle
cores, not only this process's share: `runtime.cpuload`), no worker is added where no core is
idle — it would only queue behind the load — but the prefetch grows: the stalls come and go
with the other load, and tasks kept ready carry the consumer over them. workers="auto" with
no prefetch given tunes the prefetch too, from its default up (`start`).

Settings never change the output (the order of tasks is fixed; see `runtime.scheduler`), so
the controller may be as greedy as it likes: a wrong step costs speed, never correctness.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..options import AUTO

__all__ = ["AUTO", "CONTENDED", "GAIN", "GAIN_IO", "Limits", "Observation", "Setting",
           "available_cores", "better", "decide", "memory_free", "start"]

WAITING = 0.02  # the consumer waited more than this share of the interval: input-bound
BUSY = 0.75  # a stage busy more than this share of its capacity is a limit
FREE_CORE = 0.5  # a core counts as free when at least this much of one is unused
LOW_MEMORY = 0.10  # shrink when less than this share of the machine's memory is available
CONTENDED = 0.10  # runnable tasks waited for a CPU this share of the interval: a shared machine

IDLE = 0.5  # one worker fewer when the others would still be at most this busy
GAIN = 0.05  # a step up in workers must raise the delivered rate by this share to stay
GAIN_IO = 0.15  # a doubling of io_concurrency must raise reads/s by this share to stay

START_WORKERS = 1 << 30  # i.e. `cores`: the processes are started at open anyway
START_PREFETCH = 4
START_IO = 64
START_IO_REMOTE = 256
QUEUED = 1.25  # reads taking longer than this x the fastest seen are queueing, not in flight
MAX_PREFETCH = 16
MAX_IO = 1024


@dataclass(frozen=True)
class Setting:
    """What the controller sets."""

    workers: int
    prefetch: int
    io_concurrency: int


@dataclass(frozen=True)
class Limits:
    """Bounds of each setting (inclusive), and which ones are tuned ("auto")."""

    workers: int
    prefetch: int = MAX_PREFETCH
    io_concurrency: int = MAX_IO
    min_workers: int = 0
    min_prefetch: int = 1
    tune: frozenset[str] = frozenset({"workers", "prefetch", "io_concurrency"})

    def clamp(self, s: Setting) -> Setting:
        """`s` within bounds; untuned fields are left as they are."""
        out = s
        for name, lo in (("workers", self.min_workers), ("prefetch", self.min_prefetch),
                         ("io_concurrency", 1)):
            if name in self.tune:
                out = replace(out, **{name: max(lo, min(getattr(self, name), getattr(out, name)))})
        return out


@dataclass(frozen=True)
class Observation:
    """What happened over the last interval, each figure a share of it (0..1), except
    `cores_free` (cores: those this process may use, less what the loader used)."""

    wait_fraction: float  # the consumer waited for a batch
    process_busy: float  # decoding was busy (of the current workers; of one lane at 0)
    io_busy: float  # the read slots were taken (of the current io_concurrency)
    cores_free: float
    memory_free: float = 1.0  # the machine's available memory
    read_seconds: float | None = None  # the mean time a read held its slot (None: no reads)
    read_floor: float | None = None  # the least time a read took with little queued
    cpu_pressure: float = 0.0  # some runnable task on the machine waited for a CPU

    def reads_queue(self) -> bool:
        """Whether reads take markedly longer than the fastest seen (so more would queue)."""
        return (self.read_seconds is not None and self.read_floor is not None
                and self.read_seconds > QUEUED * self.read_floor)


def decide(s: Setting, o: Observation, limits: Limits) -> Setting:
    """The next setting after observing `o` with setting `s` (see the module docstring)."""
    s = limits.clamp(s)
    tune = limits.tune
    if o.memory_free < LOW_MEMORY:
        nxt = Setting(workers=s.workers - 1, prefetch=s.prefetch // 2,
                      io_concurrency=s.io_concurrency // 2)
    elif o.wait_fraction > WAITING:
        cpu_bound = o.process_busy >= BUSY
        core = o.cores_free >= FREE_CORE
        grow = cpu_bound and core  # from 0 (one lane, in this process) to 2 lanes at once
        contended = o.cpu_pressure >= CONTENDED  # stalls come and go: a deeper queue helps
        idle = s.workers >= 2 and o.process_busy * s.workers <= (s.workers - 1) * IDLE
        nxt = Setting(workers=max(s.workers + 1, 2) if grow else
                      s.workers - 1 if idle else s.workers,
                      prefetch=s.prefetch + (not cpu_bound or core or contended),
                      io_concurrency=s.io_concurrency
                      * (2 if o.io_busy >= BUSY and not o.reads_queue() else 1))
    else:
        return s
    return limits.clamp(Setting(*(getattr(nxt if name in tune else s, name)
                                  for name in ("workers", "prefetch", "io_concurrency"))))


def better(before: float, after: float, gain: float = GAIN) -> bool:
    """Whether a step up paid: the rate `after` it beats `before` by more than `gain`
    (noise, and the cost of a process or of requests, must not keep a useless one). An io
    doubling is held to `GAIN_IO`: while reads are not queueing it about doubles reads/s
    (Little's law), so a few percent is noise over a short trial, not a gain, and a kept
    useless doubling queues every later read behind twice the requests."""
    return after > before * (1 + gain)


def available_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def memory_free() -> float:
    """The share of the machine's memory available (Linux `MemAvailable`); 1.0 unknown."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f)
                    if k in ("MemTotal", "MemAvailable")}
        return info["MemAvailable"] / info["MemTotal"]
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return 1.0


def start(workers: int | str, prefetch: int | str, io_concurrency: int | str,
          cores: int, remote: bool = False, prefetch_given: bool = True
          ) -> tuple[Setting, Limits]:
    """The first setting and the bounds, from the options as given: a number stays fixed,
    "auto" starts workers at `cores`, prefetch low, io_concurrency by where the files are
    (`remote`: in a bucket), and may grow. With "auto" workers and a prefetch not given
    (`prefetch_given` False: `prefetch` is the default), the prefetch is tuned from that
    default up, never below it."""
    tune = frozenset(name for name, v in (("workers", workers), ("prefetch", prefetch),
                                          ("io_concurrency", io_concurrency)) if v == AUTO)
    floor = 1
    if workers == AUTO and prefetch != AUTO and not prefetch_given:
        tune, floor = tune | {"prefetch"}, int(prefetch)
    cores = max(1, cores)
    first = Setting(workers=min(START_WORKERS, cores) if workers == AUTO else int(workers),
                    prefetch=START_PREFETCH if prefetch == AUTO else int(prefetch),
                    io_concurrency=(START_IO_REMOTE if remote else START_IO)
                    if io_concurrency == AUTO else int(io_concurrency))
    limits = Limits(workers=cores if workers == AUTO else first.workers,
                    prefetch=max(MAX_PREFETCH, floor) if "prefetch" in tune
                    else first.prefetch,
                    io_concurrency=MAX_IO if io_concurrency == AUTO else first.io_concurrency,
                    min_prefetch=floor, tune=tune)
    return first, limits
