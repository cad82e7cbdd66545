"""`Loader`: the running pipeline's face — lifecycle, iteration, state, figures.

It opens the files and the decode pool, compiles the plan (`aioloader.describe.plan`) and runs it:
the scheduler keeps up to `prefetch` tasks in flight and hands their results on in order
(`scheduler`), a task is looked up, fetched and run by the executor (`tasks`), and results
become batches (`output`). The output is a pure function of the dataset, the seed and the
shard. The consumer's place is one `LoaderState`, owned by the `Position`
(`statekeeping`, with the plan that runs from it), and set when an item is handed out (by
`async for`, the plain iterator's pump, or a device iterator) or a state is set; it is a
few integers, JSON-able, and resumes bit-for-bit.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..io.descriptors import too_many_open
from ..io.sync import pump
from ..options import LoaderOptions
from ..workers import Executor
from .lifecycle import Binding, LoopGuard, closed_while_waiting, forked_error
from .parts import SYNC_HANDOFF_DEPTH, Parts
from .stats import PipelineStats

if TYPE_CHECKING:
    from ..describe.dataset import Dataset
    from ..describe.state import LoaderState

log = logging.getLogger("aioloader")


class Loader:
    """A running pipeline over a `Dataset`. Create it with `Dataset.loader()`."""

    def __init__(self, dataset: Dataset, options: LoaderOptions | None = None, *,
                 state: Mapping[str, Any] | None = None) -> None:
        options = options or LoaderOptions()
        self.dataset = dataset
        self.options = options
        self._parts = Parts(self, dataset, options)  # (the workers' server starts first)
        self._position, self._stats = self._parts.position, self._parts.stats
        self._prefetch_asked = False  # start_prefetch() before the data slice was known
        if state is not None:
            self._position.resume(state)
        self._binding = Binding(self)  # the loop and process it runs on
        self._start_task: asyncio.Future | None = None
        self._guard: LoopGuard | None = None  # closes it when its loop ends
        self._closed = False
        self._closing = threading.RLock()

    @property
    def workers(self) -> int:
        """Worker processes tasks run in (0: this process); the tuner's, with "auto"."""
        return self._stats.workers

    @property
    def prefetch(self) -> int:
        """Tasks in flight at most; the tuner's, with "auto"."""
        return self._stats.prefetch

    def __repr__(self) -> str:
        return (f"Loader({' -> '.join(self.dataset.describe())}; workers={self.workers}, "
                f"prefetch={self.prefetch})")

    # -- state, and the process's shard (`Position`) -----------------------------------

    def get_state(self) -> dict[str, Any]:
        """Where the consumer is: JSON-able; pass to `loader(state=...)` to resume exactly."""
        return self._position.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from `state` (from `get_state()`); restarts work in progress."""
        replanned = self._position.resume(state)  # (another window, layout or lanes)
        if not self._closed:
            self._parts.restart(replanned)

    @property
    def process_count(self) -> int:
        """The shard count of shard_by_jax_process() (data slices; 1 without it)."""
        return self._position.shape.process_count

    @property
    def data_slice(self) -> tuple[int, int] | None:
        """shard_by_jax_process()'s `(index, count)` for this process (None without it, or
        while it waits for to_jax's sharding)."""
        return self._position.data_slice

    def use_data_slice(self, procs: tuple[int, int]) -> None:
        """shard_by_jax_process()'s `(index, count)` from the sharding `to_jax` was given
        (`aioloader.jax.data_slice`), before the first batch."""
        if self._position.use_data_slice(procs) and self._prefetch_asked:
            self.start_prefetch()

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
        self._prefetch_asked = self._position.slice_unknown
        if self._prefetch_asked:  # it starts once the data slice is known
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
        self._position.check_shard()
        self._guard = LoopGuard(self)  # `async for` without `async with`: closed with the loop
        await self._guard.arm()
        await self._parts.open()  # (the position compiles the plan for its state)
        self._parts.new_run()
        self._parts.start_tuner()

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
        pending = await self._parts.stop()
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
            pending.append(self._start_task)
        await asyncio.gather(*pending, return_exceptions=True)
        await self._parts.aclose()

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
        batch, state, _ = await self._take()
        self._position.hand_out(state)
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
            run = self._parts.run
            assert run is not None
            return await run.next(keep)
        except asyncio.CancelledError:
            if closed_while_waiting(self._closed):  # closed by another task or thread
                raise StopAsyncIteration from None
            raise
        finally:
            if os.environ.get("AIOLOADER_DEBUG") and self._stats.batches % 100 == 0:
                log.warning("aioloader stats:\n%s", self.stats())

    def __iter__(self):
        """The plain iterator: the sync pump (`aioloader.io.sync.pump`) on the background loop;
        the state is the one after the last batch handed out."""
        self._binding.check_process()
        loop = self._binding.background()
        pid = os.getpid()

        def check() -> None:
            if os.getpid() != pid:  # a forked child: the pump is the parent's
                raise forked_error(pid)

        items = pump(loop, lambda: self._take(keep=True), depth=SYNC_HANDOFF_DEPTH,
                     closing=lambda: self._closed, check=check, on_exit=self.close, held=True)
        for batch, state in items:
            self._position.hand_out(state)
            yield batch

    # -- device placement -------------------------------------------------------------

    def to_jax(self, sharding: Any = None, *, prefetch_to_device: int = 2,
               pad_final: bool = False) -> Any:
        """Iterate pytrees of `jax.Array`s placed by `sharding`, placed on a thread of its
        own up to `prefetch_to_device` ahead (`runtime.placement`, `aioloader.jax`)."""
        from .placement import DeviceIterator

        return DeviceIterator(self, sharding, prefetch_to_device=prefetch_to_device,
                              pad_final=pad_final)

    def to_jax_async(self, sharding: Any = None, *, prefetch_to_device: int = 2,
                     pad_final: bool = False) -> Any:
        """The `async for` form of `to_jax` (`aclose()` stops its placement)."""
        from .placement import AsyncDeviceIterator

        return AsyncDeviceIterator(self, sharding, prefetch_to_device=prefetch_to_device,
                                   pad_final=pad_final)

    async def num_batches(self, *, longest_shard: bool = False) -> int | None:
        """Batches this loader yields from its start state (None if endless).

        `longest_shard=True` counts for the longest process shard instead: the number of
        steps every process must take to stay in lockstep.
        """
        await self.start()
        run = self._parts.run
        assert run is not None
        return self._position.batches_from(run.start.position, longest_shard)

    # -- figures ----------------------------------------------------------------------

    @property
    def pool(self) -> Executor | None:
        """Where tasks run (a process pool's `arena` shows the shared-memory slots), once
        started."""
        return self._parts.pool

    def stats(self) -> PipelineStats:
        """Per-stage figures so far (`print()` it for a table; `.as_dict()` for machines;
        `.report("report.html")` for a page with plots over time and the table;
        `.trace("trace.json")` for a Chrome/Perfetto trace, when opened with `trace=`)."""
        return self._stats

