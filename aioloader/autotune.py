"""The autotune controller: from measured stage rates, the next workers/prefetch/io_concurrency.

Pure: `decide(setting, observation, limits)` is a function of numbers, property-tested; the
runtime (`aioloader.runtime.tuner`) measures, calls it a few times a second and applies the
result. Only settings given as "auto" move (`Limits.tune`).

The rules follow tf.data's AUTOTUNE and Grain's `pick_performance_config` in spirit, not in
code: tf.data grows a stage's parallelism while its output buffer runs dry and the CPU budget
allows; Grain sizes its process pool from the cores and memory it sees. Here:

- nothing grows unless the consumer waited (`wait_fraction`): a loader that keeps up is left
  alone, whatever its stages do;
- workers grow by one while the decode stage is busy (`process_busy`) and a core is free
  (`cores_free`), never past `Limits.workers` (at most the cores this process may use).
  Workers start at `Limits.workers` (the processes are started at open either way, a gate
  decides how many get tasks; ramping up from 0 cost a one-epoch run a quarter of its rate);
  from 0 (where a memory squeeze leaves them) they step to 2 (1 process is one lane, like
  0: the step would gain nothing and be undone), then by one; each step up is a trial, as
  in tf.data's hill climbing: the runtime measures the delivered rate before and after,
  and `better` says whether to keep it; a step that did not pay is undone and becomes the
  ceiling (on a loaded or small machine the process hop can cost more than a second core
  gives). While the consumer waits and the workers are mostly idle (the others would
  still be at most `IDLE` busy), one is given back, as a trial kept unless delivery drops:
  the wait is elsewhere (reading from a bucket on this process's CPU, say), and an idle
  process still costs that stage some CPU (measured: io256 with 2 workers delivered 0.78x of
  1 worker from the emulated bucket at 30 ms);
- io_concurrency doubles while its slots are full (`io_busy`) and reads are answered about
  as fast as with little queued (`read_seconds` within `QUEUED` x `read_floor`, the least of
  the store's median time to an answer and of the time per read seen in an interval: TCP
  Vegas's BaseRTT): by Little's law reads/s = requests in flight / time per read, so while
  the time per read holds, doubling the requests doubles the rate; once reads slow down, the
  client's CPU or the store is the limit and more requests would only queue (on a small
  machine a bucket at 30 ms saturates the client before 512 in flight: reads at 256 took
  1.3-1.45x the floor, and a doubling tried from there was undone). Steps are geometric;
  each doubling is a trial too, kept only if reads/s rise by `GAIN_IO` (a few percent is
  noise). A remote dataset starts at
  `START_IO_REMOTE` (a round trip of tens of ms needs hundreds of requests in flight to
  keep a process busy: starting at 64 cost a short run its first batches), a local one at
  `START_IO`;
- prefetch grows by one while the consumer waits, unless the decode stage is the limit with
  no core left (more tasks in flight would then only queue);
- under memory pressure (`memory_free` below `LOW_MEMORY`) each moves down instead (prefetch
  and io halve, workers drop by one) and nothing grows.

Settings never change the output (the order of tasks is fixed; see `runtime.scheduler`), so
the controller may be as greedy as it likes: a wrong step costs speed, never correctness.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from .options import AUTO

__all__ = ["AUTO", "GAIN", "GAIN_IO", "Limits", "Observation", "Setting", "available_cores",
           "better", "decide", "memory_free", "start"]

WAITING = 0.02  # the consumer waited more than this share of the interval: input-bound
BUSY = 0.75  # a stage busy more than this share of its capacity is a limit
FREE_CORE = 0.5  # a core counts as free when at least this much of one is unused
LOW_MEMORY = 0.10  # shrink when less than this share of the machine's memory is available

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
    tune: frozenset[str] = frozenset({"workers", "prefetch", "io_concurrency"})

    def clamp(self, s: Setting) -> Setting:
        """`s` within bounds; untuned fields are left as they are."""
        out = s
        for name, lo in (("workers", self.min_workers), ("prefetch", 1),
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
        idle = s.workers >= 2 and o.process_busy * s.workers <= (s.workers - 1) * IDLE
        nxt = Setting(workers=max(s.workers + 1, 2) if grow else
                      s.workers - 1 if idle else s.workers,
                      prefetch=s.prefetch + (not cpu_bound or core),
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
          cores: int, remote: bool = False) -> tuple[Setting, Limits]:
    """The first setting and the bounds, from the options as given: a number stays fixed,
    "auto" starts workers at `cores`, prefetch low, io_concurrency by where the files are
    (`remote`: in a bucket), and may grow."""
    tune = frozenset(name for name, v in (("workers", workers), ("prefetch", prefetch),
                                          ("io_concurrency", io_concurrency)) if v == AUTO)
    cores = max(1, cores)
    first = Setting(workers=min(START_WORKERS, cores) if workers == AUTO else int(workers),
                    prefetch=START_PREFETCH if prefetch == AUTO else int(prefetch),
                    io_concurrency=(START_IO_REMOTE if remote else START_IO)
                    if io_concurrency == AUTO else int(io_concurrency))
    limits = Limits(workers=cores if workers == AUTO else first.workers,
                    prefetch=MAX_PREFETCH if prefetch == AUTO else first.prefetch,
                    io_concurrency=MAX_IO if io_concurrency == AUTO else first.io_concurrency,
                    tune=tune)
    return first, limits
