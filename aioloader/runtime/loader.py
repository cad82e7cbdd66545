"""The running pipeline: asyncio stages, the async iterator, checkpointable state, stats.

Work is cut into tasks over consecutive output positions. A task looks up its record
indices (`sampling`) and where their chunks lie, fetches remote bytes through the shared
`Storage` (merged range reads, many in flight; local files the worker reads itself), and
hands it to the decode pool, which returns finished batches (or, with filter/pack, the
surviving elements of a window). A task is one batch at first; small batches from local
files then go several to a task, so the per-task cost amortizes. Up to `prefetch` tasks run
at once, and results are delivered strictly in task order, whatever finishes first: the
output is a pure function of the dataset, the seed and the shard.

State is where the consumer is: the output position after the last batch delivered, plus,
when filter or pack make batches uneven, how many elements (or packed rows) of that task
were already delivered. It is a few integers, JSON-able, and resumes bit-for-bit.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrayrecord import ArrayRecordFormatError
from ..lifecycle import LoopGuard, closed_while_waiting, forked_error
from ..planning import ChunkRefs
from ..sampling import IndexPlan, Shard, Shuffle
from ..source import ArrayRecordSource
from ..state import STATE_VERSION, StateError, check_position, check_state
from ..storage import RetryPolicy, Storage, StorageError
from ..sync import acquire, release, run_sync
from ..transforms import BatchOp, FilterOp
from ..urls import redact
from ..workers import Pipeline, Pool, Result, Task
from ..workers.arena import array_leaves
from .assembly import Assembler
from .stats import PipelineStats

if TYPE_CHECKING:
    from ..dataset import Dataset

log = logging.getLogger("aioloader")
SYNC_HANDOFF_DEPTH = 2  # batches the sync iterator's pump keeps ready beyond the prefetch
DEFAULT_WINDOW = 256
LOOKAHEAD_TASKS = 8
TASK_RECORDS = 1024  # batches are grouped into tasks of about this many records...
MAX_BATCHES_PER_TASK = 8  # ... but no more batches than this


def _resolve_index_ops(ops: tuple, procs: tuple[int, int] | None, block: int) -> list:
    """Index ops with `shard_by_jax_process()` turned into a block-dealt `Shard`."""
    from ..dataset import JaxProcessShard

    return [Shard(procs[0], procs[1], drop_remainder=op.drop_remainder, block=block)
            if isinstance(op, JaxProcessShard) and procs is not None else op for op in ops]


class Loader:
    """A running pipeline over a `Dataset`. Create it with `Dataset.loader()`."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        workers: int = 0,
        prefetch: int = 4,
        io_concurrency: int = 64,
        memory_budget: int = 512 << 20,
        state: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        window: int | None = None,
        slot_size: int = 32 << 20,
        max_gap: int | None = None,
        resident_bytes: int = 1 << 30,
    ) -> None:
        if workers < 0 or prefetch < 1:
            raise ValueError("workers must be >= 0 and prefetch >= 1")
        if workers:
            dataset.check_picklable()
        self.dataset = dataset
        self.workers = workers
        self.prefetch = prefetch
        self.io_concurrency = io_concurrency
        self.memory_budget = memory_budget
        self.retry = retry
        self.slot_size = slot_size
        self.max_gap = max_gap
        self.resident_bytes = resident_bytes
        batching = dataset.batching
        self._batch_mode = (isinstance(batching, BatchOp)
                            and not any(isinstance(op, FilterOp) for op in dataset.record_ops))
        default_unit = batching.size if isinstance(batching, BatchOp) else DEFAULT_WINDOW
        self._unit = int(window or default_unit) if not self._batch_mode else default_unit
        from ..dataset import JaxProcessShard

        self._procs: tuple[int, int] | None = None
        if any(isinstance(op, JaxProcessShard) for op in dataset.index_ops):
            from ..jax import process_index_and_count

            self._procs = process_index_and_count()
        self._plan: IndexPlan | None = None  # the index ops, once the files are open
        self._state = {"position": 0, "skip": 0, "rows": 0}
        if state is not None:
            self._apply_state(state)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_task: asyncio.Future | None = None
        self._closed = False
        self._source: ArrayRecordSource | None = None
        self._pool: Pool | None = None
        self._stats = PipelineStats(workers=workers, prefetch=prefetch,
                                    graph=dataset.describe())
        self._finalizer: weakref.finalize | None = None
        self._owner_pid: int | None = None  # the process that started it (see _bind_loop)
        self._guard: LoopGuard | None = None  # closes it when its loop ends
        self._batches_per_task = 1  # grows after the first batch (see _adapt_task_size)
        self._task_size_goal: int | None = None
        self._used_sync = False  # driven from the background loop of the sync API
        self._delivered: dict[str, int] | None = None  # sync API: after the last batch given
        self._reset_run_state()

    def __repr__(self) -> str:
        return (f"Loader({' -> '.join(self.dataset.describe())}; workers={self.workers}, "
                f"prefetch={self.prefetch})")

    # -- state ------------------------------------------------------------------------

    @property
    def process_count(self) -> int:
        return self._procs[1] if self._procs else 1

    def _fingerprint(self) -> list[str]:
        """The pipeline as text (URLs redacted: it is saved in checkpoints); with process
        sharding, the global batch instead of the local."""
        lines = self.dataset.describe()
        b = self.dataset.batching
        if self._procs and isinstance(b, BatchOp):
            lines = [f"batch(global {b.size * self._procs[1]})" if ln == b.describe() else ln
                     for ln in lines]
        return lines

    def get_state(self) -> dict[str, Any]:
        """Where the consumer is: JSON-able; pass to `loader(state=...)` to resume exactly."""
        state = self._delivered if self._delivered is not None else self._state
        return {"version": STATE_VERSION, **state, "unit": self._unit,
                "process_count": self.process_count, "pipeline": self._fingerprint()}

    def _apply_state(self, state: dict[str, Any]) -> None:
        state = check_state(state)
        # Compared redacted: states saved before URLs were redacted in the fingerprint still
        # resume, and so does a URL signed again since (the signature is not the pipeline).
        if [redact(ln) for ln in state["pipeline"]] != self._fingerprint():
            raise StateError(redact("this state was saved by a different pipeline:\n  "
                                    + " -> ".join(state["pipeline"]) + "\nis not\n  "
                                    + " -> ".join(self._fingerprint())))
        new = {k: state[k] for k in ("position", "skip", "rows")}
        unit, saved_procs = state["unit"], state["process_count"]
        if saved_procs != self.process_count:
            # Elastic resume: every global batch is the next unit*count positions of the
            # stream (block-dealt shards), so the step count carries over.
            if not self._batch_mode or new["skip"] or unit * saved_procs != \
                    self._unit * self.process_count:
                raise StateError(
                    f"state from {saved_procs} processes cannot resume on "
                    f"{self.process_count}: elastic resume needs batch() without filter/pack "
                    "and the same global batch size"
                )
            if new["position"] % unit:
                raise StateError(f"loader state position {new['position']} is not on a batch "
                                 f"boundary (a multiple of {unit}): it cannot move to "
                                 f"{self.process_count} processes")
            new["position"] = new["position"] // unit * self._unit
            unit = self._unit
        elif unit != self._unit and self._batch_mode:
            raise StateError(f"state was saved with batch size {unit}, not {self._unit}")
        if self._plan is not None:
            check_position({**new, "unit": unit}, self._plan.length, self._batch_mode)
        self._unit = unit  # stream mode: the saved window, whatever this loader's default
        self._state = new
        self._delivered = None

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from `state` (from `get_state()`); restarts work in progress."""
        self._apply_state(state)
        if self._start_task is not None and self._start_task.done() and not self._closed:
            self._restart_producer()

    # -- lifecycle --------------------------------------------------------------------

    def _check_process(self) -> None:
        if self._owner_pid is not None and self._owner_pid != os.getpid():
            raise forked_error(self._owner_pid)

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._check_process()
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._owner_pid = loop, os.getpid()
        elif self._loop is not loop:
            raise RuntimeError("a Loader runs on one event loop; this one started on another")
        return loop

    async def start(self) -> None:
        """Open the files and start prefetching (idempotent)."""
        if self._closed:
            raise RuntimeError("this loader is closed")
        self._bind_loop()
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self._start())
        try:
            await self._start_task
        except BaseException:
            await self.aclose()  # a loader that failed to start holds nothing open
            raise

    def start_prefetch(self) -> None:
        """Start opening files and fetching now, e.g. while the model restores.

        In async code it schedules the start on the running loop; otherwise on the
        background loop of the sync API. Returns at once.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._used_sync = True
            loop = acquire(self)
            asyncio.run_coroutine_threadsafe(self.start(), loop)
            return
        if self._start_task is None:
            self._bind_loop()
            self._start_task = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        ds = self.dataset
        self._guard = LoopGuard(self)  # `async for` without `async with`: closed with the loop
        await self._guard.arm()
        # Spawn the workers first: their interpreters start while the files open.
        pipeline = Pipeline(
            record_ops=ds.record_ops,
            batch=ds.batching if self._batch_mode else None,  # type: ignore[arg-type]
            batch_ops=ds.batch_ops if self._batch_mode else (),
            verify=ds.source.verify,
            max_decoded=self.memory_budget,
        )
        # Slots: tasks in flight or done (prefetch), batches in the sync hand-off, and a few
        # the consumer holds (its step, device prefetch); beyond that a batch goes by value.
        self._pool = Pool(pipeline, self.workers, slots=self.prefetch + SYNC_HANDOFF_DEPTH + 4,
                          slot_size=self.slot_size)
        self._finalizer = weakref.finalize(self, _shutdown_pool, self._pool)
        self._pool.warm_up()
        storage = Storage(concurrency=self.io_concurrency,
                          max_inflight_bytes=self.memory_budget,
                          retry=self.retry, storage_options=dict(ds.source.storage_options))
        src = ArrayRecordSource(list(ds.source.paths), storage=storage, verify=ds.source.verify,
                                max_gap=self.max_gap, resident_bytes=self.resident_bytes)
        self._source = src
        await src.aopen()
        block = ds.batching.size if isinstance(ds.batching, BatchOp) else 1
        ops = _resolve_index_ops(ds.index_ops, self._procs, block)
        needs_chunks = any(isinstance(op, Shuffle) and op.strategy == "block" for op in ops)
        self._plan = IndexPlan(len(src), ops, src.chunk_starts if needs_chunks else None)
        check_position({**self._state, "unit": self._unit}, self._plan.length, self._batch_mode)
        self._local = src.all_local
        self._restart_producer()

    def _reset_run_state(self) -> None:
        self._results: dict[int, asyncio.Future] = {}
        self._consumed_tasks = 0
        self._spans: dict[int, tuple[int, int]] = {}  # task -> its output positions
        self._ready: collections.deque = collections.deque()  # (batch, position after it)
        self._end_task: int | None = None
        self._changed: asyncio.Event | None = None
        self._producer: asyncio.Task | None = None
        self._workers_tasks: set[asyncio.Task] = set()
        self._run_start = dict(self._state)
        self._ahead: tuple | None = None  # see _lookup
        ds = self.dataset
        self._assembler = None if self._batch_mode else Assembler(
            ds.batching, ds.pack_batch, ds.batch_ops, self._run_start, self._next_window,
            self._stats.assemble)

    def _restart_producer(self) -> None:
        self._cancel_work()
        self._reset_run_state()
        self._changed = asyncio.Event()
        self._slots = asyncio.Semaphore(self.prefetch)
        self._producer = asyncio.ensure_future(self._produce())

    def _cancel_work(self) -> None:
        for t in [self._producer, *self._workers_tasks]:
            if t is not None and not t.done():
                t.cancel()
        for fut in self._results.values():  # results nobody will read: don't log them
            if fut.done() and not fut.cancelled():
                fut.exception()
            else:
                fut.cancel()

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
        self._cancel_work()
        pending = [t for t in [self._producer, *self._workers_tasks] if t is not None]
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
            pending.append(self._start_task)
        await asyncio.gather(*pending, return_exceptions=True)
        self._ready.clear()  # lent batches nobody took: their slots (and memory) go now,
        self._results.clear()  # not when the garbage collector finds this loader
        if self._finalizer is not None:
            self._finalizer()
        elif self._pool is not None:
            self._pool.close()
        if self._source is not None:
            await self._source.aclose()
            await self._source.storage.aclose()

    def close(self) -> None:
        """Close from sync code (also called when a `for` loop over the loader ends), from
        any thread: a consumer iterating in another thread (or, on the loader's loop, in
        another task) sees its iteration end (StopIteration / StopAsyncIteration, as after
        the last batch; `closed` tells the two apart). See `aclose`."""
        try:
            self._close_here()
        finally:
            if self._used_sync:  # the background loop stays up until the last user is done
                self._used_sync = False
                release(self)

    def _close_here(self) -> None:
        if self._closed:
            return
        loop = self._loop
        if self._owner_pid not in (None, os.getpid()) or loop is None or loop.is_closed():
            # Never started, its loop is gone (interpreter exit), or this is a forked child
            # (the loop and workers are the parent's): free what is this process's.
            self._closed = True
            if self._finalizer is not None:
                self._finalizer()
            return
        if self._used_sync:
            run_sync(self.aclose())
        elif loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                raise RuntimeError("close() cannot wait on the loop it runs on: use "
                                   "`await aclose()`")
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result()
        else:
            loop.run_until_complete(self.aclose())

    async def __aenter__(self) -> Loader:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- producing --------------------------------------------------------------------

    def _task_span(self, lo: int) -> tuple[int, int] | None:
        """Output positions `[lo, hi)` of the task starting at `lo`; None past the end.

        In batch mode a task covers `_batches_per_task` whole batches (the last one may be
        partial, unless drop_remainder); in stream mode one window.
        """
        assert self._plan is not None
        unit = self._unit
        hi = lo + unit * (self._batches_per_task if self._batch_mode else 1)
        length = self._plan.length
        if length is not None:
            if lo >= length:
                return None
            hi = min(hi, length)
            if self._batch_mode and self.dataset.batching.drop_remainder:  # type: ignore[union-attr]
                hi = lo + (hi - lo) // unit * unit
                if hi == lo:
                    return None
        return lo, hi

    async def _produce(self) -> None:
        loop = asyncio.get_running_loop()
        k = 0
        lo = self._run_start["position"]
        try:
            while True:
                await self._slots.acquire()
                span = self._task_span(lo)  # after the wait: the batches per task may grow
                if span is None:
                    self._slots.release()
                    self._end_task = k
                    return
                fut = loop.create_future()
                self._results[k] = fut
                self._spans[k] = span
                t = asyncio.ensure_future(self._run_task(k, *span, fut))
                self._workers_tasks.add(t)
                t.add_done_callback(self._workers_tasks.discard)
                self._changed.set()  # type: ignore[union-attr]
                lo = span[1]
                k += 1
        finally:
            if self._changed is not None:
                self._changed.set()

    async def _run_task(self, k: int, lo: int, hi: int, fut: asyncio.Future) -> None:
        try:
            fut.set_result(await self._do_task(k, lo, hi))
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
        finally:
            self._changed.set()  # type: ignore[union-attr]

    async def _do_task(self, k: int, lo: int, hi: int) -> Result:
        src, plan, pool = self._source, self._plan, self._pool
        assert src is not None and plan is not None and pool is not None
        st = self._stats
        records, epochs, refs = self._lookup(lo, hi)
        try:
            t0 = st.fetch.begin()
            try:
                task = await self._build_task(k, records, epochs, refs)
            finally:
                st.fetch.end(t0)
            t1 = st.process.begin()
            try:
                result = await pool.run(task, describe=f"task {k} (output positions "
                                                       f"{lo}..{hi - 1})")
            finally:
                st.process.end(t1)
        except (ArrayRecordFormatError, StorageError) as err:
            # A file rewritten under us shows up as corrupt bytes or short reads: say so.
            raise await src.explain(err, set(src.locate(records)[0].tolist())) from None
        if result.reads and self._local:  # the worker's reads of local files (not of a
            io = src.storage.stats        # remote dataset's copy in memory)
            io.requests += result.reads
            io.reads += result.reads
            io.bytes += result.bytes_read
        st.records += hi - lo
        st.elements += result.count
        return result

    def _lookup(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, ChunkRefs]:
        """Record indices, epochs and chunk refs of output positions `lo..hi-1`.

        Computed for LOOKAHEAD_TASKS tasks at a time: the permutation and the chunk table
        are vectorized, and most of their cost on one batch is per call, not per record.
        Tasks start in order, so the window is hit; a miss only recomputes (pure).
        """
        plan, src = self._plan, self._source
        assert plan is not None and src is not None
        w = self._ahead
        if w is None or not (w[0] <= lo and hi <= w[1]):
            stop = lo + self._unit * self._batches_per_task * LOOKAHEAD_TASKS
            if plan.length is not None:
                stop = min(stop, plan.length)
            stop = max(stop, hi)
            records, epochs = plan.lookup(np.arange(lo, stop, dtype=np.int64))
            w = self._ahead = (lo, stop, records, epochs, src.chunk_refs(records))
        a, b = lo - w[0], hi - w[0]
        return w[2][a:b], w[3][a:b], w[4].take(a, b)

    async def _build_task(self, k: int, records: np.ndarray, epochs: np.ndarray,
                          refs: ChunkRefs) -> Task:
        """What task `k` needs: where its records' chunks are (the worker reads local files,
        and the memory copies of a remote dataset kept in memory, itself), and for remote
        files their fetched bytes; the worker decodes, whatever the group size."""
        src = self._source
        assert src is not None
        if self._local:
            return Task(k, records, epochs, refs=refs)
        kept = await src.resident_refs(refs)  # a remote dataset kept in memory
        if kept is not None:
            return Task(k, records, epochs, refs=kept)
        return Task(k, records, epochs, refs=refs, raws=await src.fetch_refs(refs))

    # -- consuming --------------------------------------------------------------------

    async def _next_result(self) -> Result | None:
        """The next task's result in task order; None after the last task."""
        k = self._consumed_tasks
        while k not in self._results:
            if self._end_task is not None and k >= self._end_task:
                return None
            if self._producer is not None and self._producer.done() and \
                    self._producer.exception() is not None:
                raise self._producer.exception()  # type: ignore[misc]
            self._changed.clear()  # type: ignore[union-attr]
            await self._changed.wait()  # type: ignore[union-attr]
        fut = self._results.pop(k)
        try:
            return await fut
        finally:
            self._consumed_tasks += 1
            self._slots.release()

    def __aiter__(self) -> Loader:
        return self

    async def __anext__(self) -> Any:
        if self._closed:
            if self._start_task is not None and self._start_task.done() and \
                    not self._start_task.cancelled() and self._start_task.exception():
                raise self._start_task.exception()  # type: ignore[misc]
            raise StopAsyncIteration
        try:
            return await self._next()
        except asyncio.CancelledError:
            if closed_while_waiting(self._closed):  # closed by another task or thread
                raise StopAsyncIteration from None
            raise

    async def _next(self) -> Any:
        await self.start()
        st = self._stats
        t0 = time.perf_counter()
        st.ready_samples += 1
        st.ready_total += sum(1 for f in self._results.values() if f.done())
        try:
            if self._batch_mode:
                batch = await self._next_batch_mode()
            else:
                batch = await self._next_stream_mode()
        finally:
            st.wait_seconds += time.perf_counter() - t0
        st.batches += 1
        if st.first_batch_seconds is None:
            st.first_batch_seconds = time.perf_counter() - st.started
        if os.environ.get("AIOLOADER_DEBUG") and st.batches % 100 == 0:
            log.warning("aioloader stats:\n%s", self.stats())
        return batch

    async def _next_batch_mode(self) -> Any:
        while not self._ready:
            k = self._consumed_tasks
            result = await self._next_result()
            if result is None:
                raise StopAsyncIteration
            lo = self._spans.pop(k)[0]
            self._adapt_task_size(result.payload)
            for j, batch in enumerate(result.payload or ()):
                self._ready.append((batch, lo + (j + 1) * self._unit))
        batch, position = self._ready.popleft()
        self._state = {"position": position, "skip": 0, "rows": 0}
        return batch

    def _adapt_task_size(self, batches: list | None) -> None:
        """After the first batch: small batches from local files (or a remote dataset kept in
        memory) go several to a task (the per-task cost of scheduling and the process hop
        then amortizes), as long as they fit a slot. Read record by record from a bucket,
        the reads dominate, and bigger tasks would only queue more reads behind
        io_concurrency (stretching a stalled store's time to error).

        Tasks double in size per result up to that goal, rather than jump to it: a consumer
        that has had one batch would otherwise wait for a whole large task (one worker, a
        few times the step) before its second.
        """
        if not batches:
            return
        if self._task_size_goal is None:
            self._task_size_goal = 1
            if self._local or (self._source is not None and self._source.resident is not None):
                nbytes = sum(a.nbytes for a in array_leaves(batches[0])) + 4096
                self._task_size_goal = max(1, min(MAX_BATCHES_PER_TASK,
                                                  TASK_RECORDS // self._unit,
                                                  self.slot_size // nbytes))
        self._batches_per_task = min(self._task_size_goal, 2 * self._batches_per_task)

    async def _next_window(self) -> tuple[int, list[Any]] | None:
        """Stream mode: the next task's window position and surviving elements."""
        k = self._consumed_tasks
        result = await self._next_result()
        if result is None:
            return None
        return self._spans.pop(k)[0], result.payload

    async def _next_stream_mode(self) -> Any:
        assert self._assembler is not None
        out, self._state = await self._assembler.next()
        return out

    # -- sync API ---------------------------------------------------------------------

    def __iter__(self):
        return self._sync_batches()

    def _sync_batches(self):
        """The plain iterator: a pump on the background loop fills a `queue.Queue`.

        A ready batch is taken without a round trip to the loop thread (which would have to
        win the GIL back first); the state is the one after the last batch handed out.
        """
        self._check_process()
        pid = os.getpid()
        self._used_sync = True
        loop = acquire(self)  # the background loop stays up until close()
        handoff: queue.Queue = queue.Queue()
        credits: list[asyncio.Semaphore] = []

        async def pump() -> None:
            credits.append(asyncio.Semaphore(SYNC_HANDOFF_DEPTH))
            try:
                while True:
                    await credits[0].acquire()
                    try:
                        batch = await self.__anext__()
                    except StopAsyncIteration:
                        handoff.put(("end", None, None))
                        return
                    handoff.put(("item", batch, dict(self._state)))
            except BaseException as exc:  # cancelled by close(): the iteration ends
                closing = isinstance(exc, asyncio.CancelledError) and self._closed
                handoff.put(("end", None, None) if closing else ("error", exc, None))
                raise

        pumping = None
        try:  # (Ctrl-C may come at any line: from here on, whatever started is closed)
            pumping = asyncio.run_coroutine_threadsafe(pump(), loop)
            while True:
                if os.getpid() != pid:  # a forked child: the pump is the parent's
                    raise forked_error(pid)
                kind, value, state = handoff.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                self._delivered = state
                loop.call_soon_threadsafe(credits[0].release)
                yield value
        finally:
            if pumping is not None and os.getpid() == pid:
                pumping.cancel()
            self.close()
            handoff.queue.clear()  # batches not taken: their slots go now, not at a gc

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
        plan = self._plan
        assert plan is not None and self._source is not None
        if longest_shard and self._procs:
            block = self.dataset.batching.size  # type: ignore[union-attr]
            ops = _resolve_index_ops(self.dataset.index_ops, (0, self._procs[1]), block)
            plan = IndexPlan(len(self._source), ops, plan.chunk_starts)
        if plan.length is None:
            return None
        if not self._batch_mode:
            raise ValueError("num_batches() needs batch() without filter or pack")
        left = max(0, plan.length - self._run_start["position"])
        drop = self.dataset.batching.drop_remainder  # type: ignore[union-attr]
        return left // self._unit if drop else -(-left // self._unit)

    # -- figures ----------------------------------------------------------------------

    def stats(self) -> PipelineStats:
        """Per-stage figures so far (`print()` it for a table)."""
        st = self._stats
        if self._source is not None:
            io = self._source.storage.stats.as_dict()
            io["records_per_read"] = st.records / io["reads"] if io.get("reads") else 0.0
            st.io = io
            cache = self._source.cache
            st.cache = {"hits": cache.hits, "misses": cache.misses, "bytes": cache.bytes}
            kept = self._source.resident
            if kept is not None:
                st.cache.update(resident_bytes=kept.bytes, resident_segments=kept.resident)
        return st


def _shutdown_pool(pool: Pool) -> None:
    pool.close()
