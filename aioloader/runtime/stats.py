"""A running pipeline's figures: its stages, its transforms, the consumer's wait, and what
reads them (the table, the legend, the trace, the report).

Each stage is owned by the component that does its work and timed there (a hook, in the
manner of SPDL's `TaskStatsHook`: `runtime.stagestats`); per-transform figures come one task
at a time (`PipelineStats.add_ops`), so a slow map can be found. Busy is per core: a stage
done by N processes reads at most 100% (concurrent time is never summed into "553%").
The consumer's waiting time says whether the pipeline keeps up (a training loop that waits
> 1% of its time is input-bound). `print(it.stats())` gives a table a person can read,
`.legend()` what its columns and lines mean; `.as_dict()` the same for machines;
`.trace(path)` the spans behind them as a Chrome/Perfetto trace, when the loader records one
(`runtime.trace`: each hook hands its span on; the table and legend are in `runtime.table`);
`.report(path)` a page with plots over time (`runtime.timeline`, `runtime.report`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from .report import render_page, write_page
from .stagestats import PROCESS, Clock, OpStats, StageStats
from .table import legend, render
from .timeline import Snapshot, Timeline
from .trace import DEFAULT_EVENTS, Trace


class PipelineStats:
    """Figures of one loader since it started: its stages, transforms, consumer and I/O.

    Stages are registered in pipeline order; fetch, decode+transform and assemble exist
    from the start (`fetch`, `process`, `assemble`). The I/O and cache figures are read
    from `io_source`/`cache_source` (callables the owner gives, read when asked) plus the
    reads workers made themselves (`add_worker_reads`); `io`/`cache` may also be set.
    """

    def __init__(self, workers: int = 0, prefetch: int = 0, graph: Sequence[str] = (),
                 io_source: Callable[[], dict[str, Any]] | None = None,
                 cache_source: Callable[[], dict[str, Any]] | None = None,
                 clock: Clock = time.perf_counter, executor: str = "processes") -> None:
        self.workers = workers
        # where tasks run: the executor kind's name ("inline" with workers=0)
        self.executor = executor
        self.prefetch = prefetch
        self.graph = list(graph)
        self.io_source = io_source
        self.cache_source = cache_source
        # How the workers' results came back (`Pool.figures`): through shared memory or not
        self.transfer_source: Callable[[], dict[str, int]] | None = None
        # The autotuner's figures (`runtime.tuner`), when a setting is "auto"
        self.autotune_source: Callable[[], dict[str, Any]] | None = None
        self.clock = clock
        self.started = clock()
        self.first_batch_seconds: float | None = None
        self.batches = 0
        self.records = 0  # records read from storage (before filters)
        self.elements = 0  # elements that survived filters
        self.wait_seconds = 0.0  # time the consumer spent waiting for the next batch
        # seconds the decode lanes spent running tasks, by their own clocks (the process
        # stage's time also counts a task queued at the pool or waiting for a slot)
        self.task_seconds = 0.0
        self.ready_samples = 0
        self.ready_total = 0  # sum of ready batches seen at each request (queue occupancy)
        self.worker_reads = 0  # reads of local files the workers made themselves
        self.batches_per_task = 1  # batches a task covers now (they grow: `Plan.task_size_goal`)
        self.worker_bytes = 0
        self._io: dict[str, Any] = {}
        self._cache: dict[str, int] = {}
        self.stages: dict[str, StageStats] = {}
        self.transforms: dict[str, OpStats] = {}
        self.tracer: Trace | None = None  # spans, when tracing (`start_trace`)
        self.stage("fetch")
        self.stage(PROCESS, cores=workers)
        self.stage("assemble")
        self.timeline = Timeline(self._snapshot)  # the figures over time (`report`)
        self.timeline.take(0.0)

    # -- stages -----------------------------------------------------------------------

    def stage(self, name: str, cores: int = 1, unit: str = "workers",
              after: str | None = None) -> StageStats:
        """The stage `name`, registered (last, or right after stage `after`) if new."""
        st = self.stages.get(name)
        if st is None:
            st = StageStats(name, cores, unit, self.clock)
            st.trace = self.tracer
            if after is None:
                self.stages[name] = st
            else:
                items = list(self.stages.items())
                at = [k for k, _ in items].index(after) + 1
                self.stages = dict([*items[:at], (name, st), *items[at:]])
        return st

    fetch = property(lambda self: self.stages["fetch"])
    process = property(lambda self: self.stages[PROCESS])
    assemble = property(lambda self: self.stages["assemble"])

    def add_ops(self, names: Sequence[str], items: Sequence[int], seconds: Sequence[float],
                stage: str = PROCESS) -> None:
        """Merge one task's per-transform figures: op `names[i]` took `seconds[i]` over
        `items[i]` items. A name repeated within one task (`map(f)` twice) gets its own
        row ("map(f) #2"), so the same pipeline always lands on the same rows."""
        if not len(names) == len(items) == len(seconds):
            raise ValueError(f"add_ops: {len(names)} names, {len(items)} item counts, "
                             f"{len(seconds)} timings")
        seen: dict[str, int] = {}
        for name, n, s in zip(names, items, seconds):
            seen[name] = seen.get(name, 0) + 1
            key = name if seen[name] == 1 else f"{name} #{seen[name]}"
            op = self.transforms.get(key)
            if op is None:
                op = self.transforms[key] = OpStats(key, stage)
            op.merge(n, s)

    # -- the trace --------------------------------------------------------------------

    def start_trace(self, max_events: int = DEFAULT_EVENTS) -> Trace:
        """Record spans of every stage and worker from now on (`runtime.trace`); idempotent."""
        if self.tracer is None:
            self.tracer = Trace(self.started, max_events)
            for st in self.stages.values():
                st.trace = self.tracer
        return self.tracer

    def trace(self, path: str | os.PathLike[str]) -> str:
        """Write the spans so far to `path` as a Chrome/Perfetto trace (Trace Event Format
        JSON: open it in https://ui.perfetto.dev or chrome://tracing); returns the path.
        Needs a loader opened with `trace=True` (or a path, or AIOLOADER_TRACE=path)."""
        if self.tracer is None:
            raise ValueError("this loader records no trace: open it with ds.loader(trace=True) "
                             "(or trace='trace.json', written when it closes; or set "
                             "AIOLOADER_TRACE=trace.json)")
        return self.tracer.write(path)

    # -- the consumer and I/O ---------------------------------------------------------

    def note_batch(self, waited: float, ready: int, now: float | None = None) -> None:
        """The consumer got a batch at `now` (its caller's reading of `clock`, else read here)
        after waiting `waited` s; `ready` were ready on asking."""
        now = self.clock() if now is None else now
        self.ready_samples += 1
        self.ready_total += ready
        self.wait_seconds += waited
        if self.tracer is not None:
            self.tracer.wait(now - waited, now)
        self.batches += 1
        if self.first_batch_seconds is None:
            self.first_batch_seconds = now - self.started
        self.timeline.tick(now - self.started)  # a snapshot, if one is due

    def add_worker_reads(self, reads: int, nbytes: int) -> None:
        """Reads the workers made themselves (of local files), reported in their results."""
        self.worker_reads += reads
        self.worker_bytes += nbytes

    @property
    def io(self) -> dict[str, Any]:
        """Storage's figures with the workers' own reads added to reads/requests/bytes
        (and shown apart as worker_reads/worker_bytes), and records per read."""
        io = dict(self.io_source() if self.io_source is not None else self._io)
        if self.worker_reads or self.worker_bytes:
            for k, v in (("requests", self.worker_reads), ("reads", self.worker_reads),
                         ("bytes", self.worker_bytes)):
                io[k] = io.get(k, 0) + v
            io["worker_reads"] = self.worker_reads
            io["worker_bytes"] = self.worker_bytes
        if io:
            io["records_per_read"] = self.records / io["reads"] if io.get("reads") else 0.0
        return io

    @io.setter
    def io(self, value: dict[str, Any]) -> None:
        self._io = dict(value)

    @property
    def cache(self) -> dict[str, int]:
        """The cache's figures (the dict set, itself, when there is no `cache_source`)."""
        return dict(self.cache_source()) if self.cache_source is not None else self._cache

    @cache.setter
    def cache(self, value: dict[str, int]) -> None:
        self._cache = value  # kept as given: its owner may update() it afterwards

    # -- figures ----------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def as_dict(self) -> dict[str, Any]:
        elapsed = self.elapsed
        cores = self.process.cores
        return {
            "elapsed_s": elapsed,
            "time_to_first_batch_s": self.first_batch_seconds,
            "batches": self.batches,
            "records": self.records,
            "elements": self.elements,
            "records_per_s": self.records / elapsed if elapsed else 0.0,
            "wait_s": self.wait_seconds,
            "wait_fraction": self.wait_seconds / elapsed if elapsed else 0.0,
            "mean_ready_batches": self.ready_total / self.ready_samples
            if self.ready_samples else 0.0,
            "stages": {name: st.as_dict(elapsed) for name, st in self.stages.items()},
            "transforms": {name: op.as_dict(elapsed, self._cores_of(op.stage, cores))
                           for name, op in self.transforms.items()},
            "io": self.io,
            "cache": dict(self.cache),
            "workers": self.workers,
            "executor": self.executor,
            "prefetch": self.prefetch,
            "batches_per_task": self.batches_per_task,
            "transfers": self.transfer_source() if self.transfer_source is not None else {},
            **({"autotune": self.autotune_source()} if self.autotune_source is not None
               else {}),
        }

    def _snapshot(self, t: float) -> Snapshot:
        """The counters `timeline` keeps, as they stand now (`t`: the time it is taken at)."""
        io, cache = self.io, self.cache
        snap: Snapshot = {"batches": self.batches, "records": self.records,
                          "wait_s": self.wait_seconds, "reads": io.get("reads", 0),
                          "bytes": io.get("bytes", 0), "retries": io.get("retries", 0),
                          "io_busy_s": io.get("busy_seconds", 0.0),
                          "cache_hits": cache.get("hits", 0),
                          "cache_misses": cache.get("misses", 0)}
        for name, st in self.stages.items():
            snap[f"busy:{name}"] = st.busy_seconds()
            snap[f"cores:{name}"] = st.cores
        return snap

    def report(self, path: str | os.PathLike[str]) -> str:
        """Write a page that opens with no network (`runtime.report`): plots over time
        (batches/s, the wait, busy per stage, reads in flight, cache hits, retries), the
        table and its legend, to exactly `path` (a folder is refused); returns the path."""
        page = render_page(self.as_dict(), self.timeline.samples(self.elapsed), str(self),
                           list(self.stages))
        return write_page(page, path)

    def _cores_of(self, stage: str, default: int) -> int:
        st = self.stages.get(stage)
        return st.cores if st is not None else default

    def legend(self) -> str:
        """What each column and line of the table (`str(stats)`) means."""
        return legend()

    def __str__(self) -> str:
        return render(self.as_dict(), self.graph,
                      {name: st.unit for name, st in self.stages.items()})
