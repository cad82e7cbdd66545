"""`Loader`: the running pipeline's face — lifecycle, iteration, state, figures.

It opens the files and the decode pool, compiles the plan (`aioloader.plan`) and runs it:
the scheduler keeps up to `prefetch` tasks in flight and hands their results on in order
(`scheduler`), a task is looked up, fetched and run by the pool (`tasks`), and results
become batches (`output`). The output is a pure function of the dataset, the seed and the
shard. The consumer's place is one `LoaderState`, set when an item is handed out (by `async
for`, the plain iterator's pump, or a device iterator) and nowhere else; it is a few
integers, JSON-able, and resumes bit-for-bit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..autotune import Setting, available_cores
from ..autotune import start as tuning_start
from ..descriptors import too_many_open
from ..lifecycle import Binding, LoopGuard, closed_while_waiting, forked_error
from ..mixed import opened
from ..options import LoaderOptions
from ..plan import longest_shard, with_layout
from ..sync import pump
from ..urls import is_local
from ..workers import Executor
from ..workers.procs import start_server
from .output import Run
from .parts import SYNC_HANDOFF_DEPTH, Parts
from .statekeeping import StateKeeping
from .stats import PipelineStats
from .tuner import Tuner

if TYPE_CHECKING:
    from ..dataset import Dataset
    from ..state import LoaderState

log = logging.getLogger("aioloader")


class Loader(StateKeeping):
    """A running pipeline over a `Dataset`. Create it with `Dataset.loader()`."""

    def __init__(self, dataset: Dataset, options: LoaderOptions | None = None, *,
                 state: Mapping[str, Any] | None = None) -> None:
        options = options or LoaderOptions()
        self.dataset = dataset
        self.options = options
        # "auto" settings start here and are tuned while running (`runtime.tuner`)
        self._cores = available_cores()
        self._setting, self._limits = tuning_start(
            options.worker.workers, options.prefetch.prefetch, options.read.io_concurrency,
            self._cores, remote=_remote(dataset))
        self._tuner: Tuner | None = None
        self.workers = self._setting.workers
        self.prefetch = self._setting.prefetch
        if self.workers or "workers" in self._limits.tune:  # (auto: processes may come)
            dataset.check_picklable()
            start_server()  # it loads while the files open (`workers.procs`)
        self._init_shard(state)
        self._stats = PipelineStats(workers=self.workers, prefetch=self.prefetch,
                                    graph=dataset.describe())
        trace = options.trace if options.trace is not None else \
            os.environ.get("AIOLOADER_TRACE") or None
        self._trace_path = trace if isinstance(trace, str) else None
        if trace:
            self._stats.start_trace()
        self._parts = Parts(self, dataset, options, self._shape, self._stats,
                            self._setting, self._limits)
        if state is not None:
            self._apply_state(state)
        self._run: Run | None = None
        self._binding = Binding(self)  # the loop and process it runs on
        self._start_task: asyncio.Future | None = None
        self._guard: LoopGuard | None = None  # closes it when its loop ends
        self._closed = False
        self._closing = threading.RLock()

    def __repr__(self) -> str:
        return (f"Loader({' -> '.join(self.dataset.describe())}; workers={self.workers}, "
                f"prefetch={self.prefetch})")

    # (state, and the process's shard: `StateKeeping`)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Open the files and start prefetching (idempotent)."""
        if self._closed:
            raise RuntimeError("this loader is closed")
        self._binding.bind()
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self._start())
        try:
            await self._start_task
        except BaseException as exc:
            await self.aclose()  # a loader that failed to start holds nothing open
            if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE) \
                    and "RLIMIT_NOFILE" not in str(exc):
                raise too_many_open(exc, "starting the loader") from exc
            raise

    def start_prefetch(self) -> None:
        """Start opening files and fetching now, e.g. while the model restores.

        In async code it schedules the start on the running loop; otherwise on the
        background loop of the sync API. Returns at once. (Before `to_jax(sharding)` has
        said this process's data slice, it starts then.)
        """
        if self._defer_prefetch():
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run_coroutine_threadsafe(self.start(), self._binding.background())
            return
        if self._start_task is None:
            self._binding.bind()
            self._start_task = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        self._check_shard()
        self._guard = LoopGuard(self)  # `async for` without `async with`: closed with the loop
        await self._guard.arm()
        plan = await self._parts.open(self._state.unit, self._state.layout, self._state)
        self._state = self._moved(self._state)
        self._state.check_position(plan.length, plan.batch_mode, plan.cuts)
        self._new_run()
        if self._limits.tune:
            storage = getattr(self._parts.source, "storage", None)
            pool = self._parts.pool
            self._tuner = Tuner(self._setting, self._limits, self._stats, self._cores,
                                self._tune, io_held=getattr(storage, "slots_held_seconds",
                                                            None),
                                settled=lambda: pool is None or pool.settled(),
                                reads=lambda: storage.stats.reads if storage else 0,
                                base_rtt=getattr(storage, "base_rtt", lambda: None))
            self._stats.autotune_source = self._tuner.figures
            self._tuner.start()

    def _tune(self, s: Setting) -> None:
        """Apply the tuner's setting: the worker gate, the tasks in flight, the requests."""
        p, st = self._parts, self._stats
        tune = self._limits.tune
        if "workers" in tune and p.pool is not None:
            p.pool.set_workers(s.workers)  # (0: tasks run in this process)
            self.workers = st.workers = s.workers
            st.process.cores = max(1, s.workers)
        if "prefetch" in tune:
            self.prefetch = st.prefetch = s.prefetch
            if self._run is not None:
                self._run.scheduler.set_depth(s.prefetch)
        storage = getattr(p.source, "storage", None)
        if "io_concurrency" in tune and storage is not None:
            storage.set_concurrency(s.io_concurrency)

    def _new_run(self) -> None:
        p = self._parts
        assert p.plan is not None and p.runner is not None
        if p.plan.unit != self._state.unit:  # a stream-mode state set with another window
            p.plan = dataclasses.replace(p.plan, unit=self._state.unit)
            p.runner.use(p.plan)
        if p.plan.layout != self._state.layout:  # a state moved from another process count
            p.plan = with_layout(p.plan, self.dataset, self._state.layout)
            p.runner.use(p.plan)
        if p.runner.plan is not p.plan:  # another elastic stream-mode lane (set_state)
            p.runner.use(p.plan)
        self._run = Run(p.plan, p.runner, self._state, self.prefetch, self.dataset, self._stats)

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Stop everything: tasks, worker processes, shared memory, connections.

        A consumer waiting for a batch in another task sees its iteration end
        (StopAsyncIteration, as after the last batch; `closed` tells the two apart). A
        worker still busy in a transform gets `workers.CLOSE_GRACE_S` (2 s) to finish, then
        is terminated.
        """
        if self._closed:
            return
        self._closed = True
        if self._guard is not None:
            self._guard.disarm()
        if self._tuner is not None:
            await self._tuner.aclose()
        pending: list[Any] = self._run.scheduler.cancel() if self._run is not None else []
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
            pending.append(self._start_task)
        await asyncio.gather(*pending, return_exceptions=True)
        if self._run is not None:
            await self._run.aclose()
        await self._parts.aclose()
        if self._trace_path:
            try:
                self._stats.trace(self._trace_path)
                log.info("wrote the trace to %s", self._trace_path)
            except OSError as exc:
                log.warning("the trace could not be written to %s: %s", self._trace_path, exc)

    def close(self) -> None:
        """Close from sync code (also called when a `for` loop over the loader ends), from
        any thread: a consumer iterating in another thread (or, on the loader's loop, in
        another task) sees its iteration end (StopIteration / StopAsyncIteration, as after
        the last batch; `closed` tells the two apart). See `aclose`."""
        with self._closing:  # a second closer waits for the first: the background loop is
            try:             # released only once nothing runs on it any more
                if not self._closed:
                    self._binding.close(self.aclose, self._close_unreachable)
            finally:
                self._binding.release()

    def _close_unreachable(self) -> None:
        self._closed = True
        self._parts.free()

    async def __aenter__(self) -> Loader:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- consuming --------------------------------------------------------------------

    def __aiter__(self) -> Loader:
        return self

    async def __anext__(self) -> Any:
        batch, self._state, _ = await self._take()
        return batch

    async def _take(self, keep: bool = False
                    ) -> tuple[Any, LoaderState, Callable[[], None] | None]:
        """The next item, the state after it (the caller hands it out), and, with `keep`,
        what to call on the loop once the consumer took it (`Run.next`)."""
        if self._closed:
            if self._start_task is not None and self._start_task.done() and \
                    not self._start_task.cancelled() and self._start_task.exception():
                raise self._start_task.exception()  # type: ignore[misc]
            raise StopAsyncIteration
        try:
            await self.start()
            run, st = self._run, self._stats
            assert run is not None
            ready, t0 = run.scheduler.ready, time.perf_counter()
            item = await run.next(keep)
            st.note_batch(time.perf_counter() - t0, ready)
            return item
        except asyncio.CancelledError:
            if closed_while_waiting(self._closed):  # closed by another task or thread
                raise StopAsyncIteration from None
            raise
        finally:
            if os.environ.get("AIOLOADER_DEBUG") and self._stats.batches % 100 == 0:
                log.warning("aioloader stats:\n%s", self.stats())

    def __iter__(self):
        """The plain iterator: the sync pump (`aioloader.sync.pump`) on the background loop;
        the state is the one after the last batch handed out."""
        self._binding.check_process()
        loop = self._binding.background()
        pid = os.getpid()

        def check() -> None:
            if os.getpid() != pid:  # a forked child: the pump is the parent's
                raise forked_error(pid)

        items = pump(loop, lambda: self._take(keep=True), depth=SYNC_HANDOFF_DEPTH,
                     closing=lambda: self._closed, check=check, on_exit=self.close, held=True)
        for batch, self._state in items:
            yield batch

    # -- device placement -------------------------------------------------------------

    def to_jax(self, sharding: Any = None, *, prefetch_to_device: int = 2,
               pad_final: bool = False) -> Any:
        """Iterate pytrees of `jax.Array`s placed by `sharding` (see `aioloader.jax`)."""
        from ..jax import DeviceIterator

        return DeviceIterator(self, sharding, prefetch_to_device=prefetch_to_device,
                              pad_final=pad_final)

    def to_jax_async(self, sharding: Any = None, *, prefetch_to_device: int = 2,
                     pad_final: bool = False) -> Any:
        """The `async for` form of `to_jax`."""
        from ..jax import AsyncDeviceIterator

        return AsyncDeviceIterator(self, sharding, prefetch_to_device=prefetch_to_device,
                                   pad_final=pad_final)

    async def num_batches(self, *, longest_shard: bool = False) -> int | None:
        """Batches this loader yields from its start state (None if endless).

        `longest_shard=True` counts for the longest process shard instead: the number of
        steps every process must take to stay in lockstep.
        """
        await self.start()
        plan, run = self._parts.plan, self._run
        assert plan is not None and run is not None
        index = _longest(plan, self.dataset) if longest_shard else plan.index
        if index.length is None:
            return None
        if not plan.batch_mode:
            raise ValueError("num_batches() needs batch() without filter, flat_map or pack")
        return plan.batches_from(run.start.position, index.length)

    # -- figures ----------------------------------------------------------------------

    @property
    def pool(self) -> Executor | None:
        """Where tasks run (a process pool's `arena` shows the shared-memory slots), once
        started."""
        return self._parts.pool

    def stats(self) -> PipelineStats:
        """Per-stage figures so far (`print()` it for a table; `.as_dict()` for machines;
        `.trace("trace.json")` for a Chrome/Perfetto trace, when opened with `trace=`)."""
        return self._stats


_longest = longest_shard


def _remote(dataset: Dataset) -> bool:
    """Whether any of the dataset's files lies in a bucket (or behind any non-local URL)."""
    spec = opened(dataset.source)
    return any(not is_local(p) for p in getattr(spec, "paths", ()))
