"""The decode pool: worker processes that turn fetched chunks into finished batches.

A task carries the raw chunk bytes (or already decoded records) for one batch or window; the
worker decodes, runs the record transforms, and collates inside the process, so that only
finished batches come back. Bytes travel through the shared-memory arena both ways
(`aioloader.arena`): the batch's arrays are stacked right in a slot and lent to the consumer
as views; what does not fit, or finds no free slot, travels by value through the pipe
instead. Local files are read by the workers themselves.

Workers are spawned (not forked: the parent runs an event loop and threads), and `workers=0`
runs the same task code on one daemon thread of the parent, for debugging (`aioloader.inline`).
Workers ignore Ctrl-C: the parent decides, and `Pool.close` gives a worker still busy
`CLOSE_GRACE_S` seconds to finish before terminating it, so a transform that never returns
cannot hold up a shutdown (with workers=0 the stuck thread is left behind, with a warning).
A worker that cannot load the pipeline (a transform it cannot unpickle) stays up and fails
every task with the cause, naming the transform, instead of dying.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import logging
import mmap
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arena import (
    PIPE_BYTES,
    Arena,
    Blob,
    Pickled,
    SlotAlloc,
    replace_leaves,
)
from .arrayrecord.chunk import DEFAULT_MAX_DECODED
from .arrayrecord.index import decode_records
from .inline import InlineExecutor
from .localfiles import LocalFiles
from .planning import ChunkRefs
from .semnames import forget_names, pool_semaphores
from .transforms import (
    BatchOp,
    MapOp,
    RecordOp,
    apply_batch_ops,
    apply_record_ops,
    collate_named,
)

log = logging.getLogger("aioloader")
CLOSE_GRACE_S = 2.0  # how long close() lets a busy worker finish before terminating it


class WorkerError(RuntimeError):
    """A worker process died, or could not send its result back; the message says why."""


@dataclass(frozen=True)
class Pipeline:
    """What every worker runs (sent once, when the pool starts)."""

    record_ops: tuple[RecordOp, ...]
    batch: BatchOp | None  # collate in the worker; None: return elements (filter/pack mode)
    batch_ops: tuple[MapOp, ...]
    verify: str = "headers"
    max_decoded: int = DEFAULT_MAX_DECODED  # the most one chunk may decode to (memory_budget)


@dataclass
class Task:
    """One unit of work: the records of one batch (or window), in output order.

    Either `refs` (where each record's chunk lies; with `raws` the fetched chunk bytes, or
    none when the files are local and the worker reads them itself) or `records` (decoded
    bytes) is set.
    """

    task_id: int
    indices: np.ndarray  # global record index of each record
    epochs: np.ndarray
    refs: ChunkRefs | None = None
    raws: list | None = None  # physical chunk bytes, parallel to refs
    records: list[bytes] | None = None
    raw_spans: list[tuple[int, int]] | None = None  # raws placed in the slot's input half
    slot: int = -1


@dataclass
class Result:
    task_id: int
    payload: Any  # batch mode: a list of batches (arrays may be ShmRef); else the elements
    count: int  # elements that survived the filters
    slot: int = -1
    reads: int = 0  # local reads the worker made itself, and their bytes
    bytes_read: int = 0


# -- the code that runs in a worker ---------------------------------------------------

_pipeline: Pipeline | None = None
_init_error: str | None = None
_arena: mmap.mmap | None = None
_slot_size = 0


def _raise_malloc_thresholds() -> None:
    """Free one 16 MiB block, so that glibc raises its mmap and trim thresholds, as it does
    in any process after a large free.

    Every record is a fresh ~record-sized buffer (the read, then the decoded record). With
    the initial thresholds, a process (or thread) that never freed a large block trims its
    heap after each batch and faults the same pages back in on the next: measured, 64 KiB
    records decoded 1.5-2.5x slower than in a warmed-up process. Elsewhere this is a no-op.
    """
    block = bytearray(16 << 20)  # below glibc's 32 MiB cap for the dynamic threshold
    del block


def _init_worker(pipeline_parts: tuple, arena_path: str | None, slot_size: int,
                 unlink_path: str | None = None, started: Any = None) -> None:
    """Load the pipeline and map the arena; what fails is kept (`_init_error`) and raised
    by every task, so the parent gets the cause at once instead of a dead worker. Releases
    `started`: this worker has opened the pool's semaphores (`Pool._forget_names`)."""
    global _pipeline, _arena, _slot_size, _init_error
    if started is not None:
        started.release()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _raise_malloc_thresholds()
    _slot_size = slot_size
    _watch_parent(unlink_path)
    try:
        _pipeline = _load_pipeline(pipeline_parts)
        if arena_path is not None:
            fd = os.open(arena_path, os.O_RDWR)
            try:
                _arena = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
    except WorkerError as exc:
        _init_error = str(exc)
    except Exception as exc:
        _init_error = f"a worker process could not start ({type(exc).__name__}: {exc})"


def _pack_pipeline(pipeline: Pipeline) -> tuple:
    """The pipeline pickled op by op (with each op's description), so that a worker that
    cannot unpickle one can say which (`_load_pipeline`)."""
    rest = dataclasses.replace(pipeline, record_ops=(), batch_ops=())
    return (pickle.dumps(rest), [(op.describe(), pickle.dumps(op)) for op in pipeline.record_ops],
            [(op.describe(), pickle.dumps(op)) for op in pipeline.batch_ops])


def _load_pipeline(parts: tuple) -> Pipeline:
    rest, record_ops, batch_ops = parts

    def load(describe: str, blob: bytes) -> Any:
        try:
            return pickle.loads(blob)
        except Exception as exc:
            raise WorkerError(
                f"{describe} cannot be loaded in a worker process ({type(exc).__name__}: "
                f"{exc}); define it in a module the workers can import (not in __main__ of "
                "an interactive session or notebook, nor added at run time), or use "
                "workers=0") from None

    return dataclasses.replace(load("the pipeline", rest),
                               record_ops=tuple(load(*op) for op in record_ops),
                               batch_ops=tuple(load(*op) for op in batch_ops))


def _watch_parent(unlink_path: str | None) -> None:
    """Exit if the parent dies without closing us, e.g. on SIGKILL (and remove the arena's
    name where it has one: without memfd, see `aioloader.memfile`).

    Spawned workers would otherwise wait forever on the pool's queue, holding the shared
    memory and the resource tracker alive.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        if unlink_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(unlink_path)
        os._exit(1)

    threading.Thread(target=watch, name="aioloader-parent-watch", daemon=True).start()


_files = LocalFiles()


def _records_of(task: Task, pipeline: Pipeline, files: LocalFiles, arena: Any,
                paths: list[str] | None) -> list[bytes]:
    """The task's records; `paths` names each record's file in errors."""
    if task.records is not None:
        return task.records
    refs = task.refs
    assert refs is not None
    if task.raw_spans is not None:
        view = memoryview(arena)
        raws: list = [view[o : o + n] for o, n in task.raw_spans]
    elif task.raws is not None:
        raws = task.raws
    else:
        raws = files.read(refs)
    return decode_records(raws, refs.start.tolist(), refs.within.tolist(),
                          verify=pipeline.verify, paths=paths, chunks=refs.chunk.tolist(),
                          counts=None if refs.count is None else refs.count.tolist(),
                          max_decoded=pipeline.max_decoded)


def run_task(task: Task, pipeline: Pipeline | None = None, files: LocalFiles | None = None,
             arena: Any = None, slot_size: int = 0) -> Result:
    """Decode, transform and (in batch mode) collate one task.

    In a worker process the pipeline, descriptors and arena are this process's globals; the
    inline pool (workers=0) passes its own.
    """
    inline = pipeline is not None
    if not inline and _init_error is not None:
        raise WorkerError(_init_error)
    pipeline = pipeline or _pipeline
    assert pipeline is not None, "worker not initialised"
    files = files or _files
    arena = arena if inline else _arena
    slot_size = slot_size if inline else _slot_size
    reads, nbytes = files.reads, files.bytes
    refs = task.refs
    paths = [refs.name(f) for f in refs.file.tolist()] if refs is not None else None
    records = _records_of(task, pipeline, files, arena, paths)
    io = {"reads": files.reads - reads, "bytes_read": files.bytes - nbytes}
    elements = apply_record_ops(pipeline.record_ops, records, task.indices.tolist(),
                                task.epochs.tolist(), paths)
    if pipeline.batch is None:
        payload, slot, room = elements, -1, _room(arena, task.slot, slot_size)
    else:  # the task's elements are one or more whole batches (the last may be short)
        size = pipeline.batch.size
        alloc = _room(arena, task.slot, slot_size)
        indices, epochs = task.indices, task.epochs

        def record(k: int) -> str:
            where = f" in {paths[k]}" if paths and paths[k] else ""
            return f"record {indices[k]} (epoch {epochs[k]}){where}"

        batches = [apply_batch_ops(pipeline.batch_ops, collate_named(
                       elements[i : i + size], lambda k, i=i: record(i + k), alloc=alloc))
                   for i in range(0, len(elements), size)]
        placed = alloc.export(batches) if alloc is not None else None
        if placed is None:  # no slot, or too big for it: the batches travel by value
            payload = replace_leaves(batches, np.copy) if inline and alloc is not None else batches
            slot, room = -1, None
        else:
            payload, slot, room = placed, task.slot, alloc
    if not inline:  # what is not an array in the slot (strings, say) is pickled, once
        payload = _outgoing(payload, room)
    return Result(task.task_id, payload, len(elements), slot, **io)


def _room(arena: Any, slot: int, slot_size: int) -> SlotAlloc | None:
    """The output half of `slot`, or None when there is no slot."""
    return SlotAlloc(arena, slot * 2 * slot_size, slot_size) if arena is not None and \
        slot >= 0 else None


def _outgoing(payload: Any, room: SlotAlloc | None) -> Pickled | Blob:
    """`payload` pickled once, in the worker: into the rest of its slot when it is more than
    the pipe holds and fits (the parent unpickles it from shared memory, instead of both
    processes copying it through a 64 KiB pipe a buffer at a time), else as bytes for the
    pipe. Either way the parent unpickles it (`Arena.unpickle`)."""
    try:
        blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise WorkerError(
            f"a worker cannot send its result back ({type(exc).__name__}: {exc}): what "
            "transforms return in worker processes must pickle (arrays, numbers, strings, "
            "and dicts, lists or tuples of them); convert it in the transform, or run "
            "with workers=0") from None
    placed = room.place(blob) if room is not None and len(blob) >= PIPE_BYTES else None
    return placed or Blob(blob)


# -- the parent's side ----------------------------------------------------------------


def _retrieve(fut: asyncio.Future) -> None:
    """Mark a future's exception as seen (its waiter may have been cancelled)."""
    if not fut.cancelled():
        fut.exception()


_live_pools: weakref.WeakSet[Pool] = weakref.WeakSet()


def _close_pools_at_exit() -> None:
    """Close the pools nobody closed, before concurrent.futures joins their manager threads
    at interpreter exit (which waits for every running task: for ever, if a transform never
    returns). Runs first: threading's exit hooks run in reverse order of registration."""
    for pool in list(_live_pools):
        with contextlib.suppress(Exception):
            pool.close()


getattr(threading, "_register_atexit", atexit.register)(_close_pools_at_exit)
_forked = False  # this process is a fork of one that may have started the forkserver


def _after_fork_in_child() -> None:
    global _forked, _live_pools
    _forked = True
    _live_pools = weakref.WeakSet()  # the parent's, not ours to close


os.register_at_fork(after_in_child=_after_fork_in_child)


def _context() -> multiprocessing.context.BaseContext:
    """forkserver where there is one (Linux): the first pool starts one clean server process
    with NumPy and this module loaded, and every worker after that is a fork of it (a few
    ms instead of a fresh interpreter's ~0.15 s); spawn elsewhere, and in a forked child
    (multiprocessing's forkserver state there is the parent's, and unusable). Never plain
    fork: the parent runs an event loop and threads."""
    if "forkserver" in multiprocessing.get_all_start_methods() and not _forked:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["aioloader.workers"])
        return ctx
    return multiprocessing.get_context("spawn")


class Pool:
    """Runs tasks in `workers` processes (or inline on one thread when workers == 0)."""

    def __init__(self, pipeline: Pipeline, workers: int, *, slots: int,
                 slot_size: int = 32 << 20) -> None:
        self.pipeline = pipeline
        self.workers = workers
        self._pid = os.getpid()
        self._closing = threading.Lock()
        self._closed = False
        self._procs: list = []
        self._files = LocalFiles()  # the inline worker's (workers == 0)
        self.arena = Arena(slots, slot_size)
        if workers == 0:
            self._executor: Any = InlineExecutor()
            _raise_malloc_thresholds()
            return
        self._names_lock = threading.Lock()
        self._unstarted = workers  # workers that have not yet released `_started`
        try:
            ctx = _context()
            self._started = ctx.Semaphore(0)
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=(_pack_pipeline(pipeline), self.arena.path, slot_size,
                          self.arena.named_path, self._started),
            )
        except BaseException:
            self.arena.close()
            raise
        _live_pools.add(self)

    def warm_up(self) -> None:
        """Start the worker processes now (spawning takes a while) instead of on first use."""
        if self.workers:
            for _ in range(self.workers):
                self._executor.submit(os.getpid).add_done_callback(self._forget_names)
            self._procs = list((getattr(self._executor, "_processes", None) or {}).values())

    def _forget_names(self, _: Any = None) -> None:
        """Once every worker has started (each releases `_started` when it has unpickled the
        queues, opening their semaphores by name), unlink those names, so that no kill can
        leave them in /dev/shm (`aioloader.semnames`). Checked at each result: until then
        (the workers' start-up) a kill of the whole group still leaves them."""
        with self._names_lock:
            if not self._unstarted:
                return
            while self._unstarted and self._started.acquire(False):
                self._unstarted -= 1
            if not self._unstarted:
                forget_names([*pool_semaphores(self._executor), self._started])

    async def run(self, task: Task, describe: str = "") -> Result:
        """Run one task; a batch comes back as views of its arena slot (see `Arena.lend`)."""
        arena = self.arena
        slot = task.slot = arena.take()
        lent = False
        cf = None
        try:
            if self.workers == 0:
                cf = self._executor.submit(run_task, task, self.pipeline, self._files,
                                           arena.map, arena.slot_size,
                                           label=describe or f"task {task.task_id}")
            else:
                if task.raws is not None:
                    spans = arena.place_inputs(slot, task.raws) if slot >= 0 else None
                    if spans is not None:
                        task.raw_spans, task.raws = spans, None
                    else:  # no slot, or too big for it: pickle them through the pipe
                        task.raws = [bytes(r) for r in task.raws]
                cf = self._executor.submit(run_task, task)
            # Shielded: cancelling a waiting task must not cancel `cf`, which races the
            # executor's own clean-up of a broken pool (CPython 3.11 then crashes its manager
            # thread and leaks the queue feeder); close() cancels what never started.
            wrapped = asyncio.wrap_future(cf)
            wrapped.add_done_callback(_retrieve)
            result = await asyncio.shield(wrapped)
            if self.workers and self._unstarted:
                self._forget_names()
            if isinstance(result.payload, (Pickled, Blob)):
                result.payload = arena.unpickle(result.payload)
            if result.slot >= 0 and result.payload is not None:
                result.payload = arena.lend(result.payload, result.slot)
                lent = True
            return result
        except asyncio.CancelledError:
            if cf is not None and not cf.done():  # the worker still writes into the slot
                cf.add_done_callback(lambda _: arena.give(slot))
                slot = -1
            raise
        except WorkerError as exc:  # raised in the worker: say which task it was
            raise WorkerError(f"{describe or f'task {task.task_id}'}: {exc}") from None
        except BrokenProcessPool:
            raise WorkerError(
                f"a worker process died while processing {describe or f'task {task.task_id}'}"
                f"{self._exit_codes()}; the loader cannot continue (restart it from the last "
                "state; if a transform crashes the interpreter, run with workers=0 to debug)"
            ) from None
        finally:
            if not lent:
                arena.give(slot)

    def _exit_codes(self) -> str:
        """How the dead worker died, e.g. ' (signal 9)'; waits briefly for its exit status."""
        procs = self._procs or list((getattr(self._executor, "_processes", None) or {})
                                    .values())
        # The executor's manager thread reads the dead worker's status from the forkserver
        # as it handles the broken pool; reading it at the same time from here, one of the two
        # gets EOF, which multiprocessing reports as exit code 255. Let it finish first (its
        # reading is then cached on the process).
        manager = getattr(self._executor, "_executor_manager_thread", None)
        if manager is not None and manager is not threading.current_thread():
            manager.join(1.0)
        deadline = time.monotonic() + 1.0
        codes: list[int] = []
        while procs and time.monotonic() < deadline:
            codes = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if codes:
                break
            time.sleep(0.02)
        if not codes:
            return ""
        signals = [f"signal {-c}" for c in codes if c < 0]
        return f" ({', '.join(signals) if signals else f'exit code {codes[0]}'})"

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop the workers and free the arena. Tasks not started are dropped; a worker
        still busy after `grace` seconds (a transform that never returns) is terminated,
        then killed; with workers=0 its thread, which cannot be killed, is left running (a
        warning on the "aioloader" logger names the task). In a forked child only this
        process's copies are let go: the workers, queues and threads are the parent's."""
        with self._closing:  # at exit the main thread may close it while the loop's does
            if self._closed:
                return
            self._closed = True
            try:
                if self._pid == os.getpid():
                    self._stop_workers(grace)
            finally:
                self._files.close()
                self.arena.close()

    def _stop_workers(self, grace: float) -> None:
        ex = self._executor
        if not self.workers:
            stuck = ex.close(grace)
            # The arena is closed under a stuck thread all the same: a view it holds keeps
            # the map alive (close is then a no-op), and a closed map refuses access with
            # ValueError in that thread, never a crash.
            if stuck is not None:
                ops = [op.describe() for op in (*self.pipeline.record_ops,
                                                *self.pipeline.batch_ops)]
                log.warning(
                    "the inline worker (workers=0) is still running %s %.0f s after close: "
                    "a transform (%s) does not return; its thread is left behind (a daemon "
                    "thread: it does not keep the process from exiting)", stuck, grace,
                    " -> ".join(ops) or "none")
            return
        procs = list((getattr(ex, "_processes", None) or {}).values()) if self.workers else []
        ex.shutdown(wait=not procs, cancel_futures=True)
        if procs:
            try:
                _stop(procs, grace)
            except BaseException:  # Ctrl-C again while waiting: no more grace
                for p in procs:
                    with contextlib.suppress(OSError, ValueError):
                        p.kill()
                raise
            ex.shutdown(wait=True)  # the workers are gone: the manager thread ends at once


def _stop(procs: list, grace: float) -> None:
    """Wait up to `grace` s for `procs` to exit (the executor asked them to), then SIGTERM,
    then SIGKILL. Waits on their sentinels only: their exit status is the executor's to
    read."""
    def wait_for_exit(seconds: float) -> list:
        deadline = time.monotonic() + seconds
        while True:
            left = [p for p in procs if not multiprocessing.connection.wait([p.sentinel], 0)]
            rest = deadline - time.monotonic()
            if not left or rest <= 0:
                return left
            multiprocessing.connection.wait([p.sentinel for p in left], rest)

    left = wait_for_exit(grace)
    for stop in ("terminate", "kill"):
        if not left:
            return
        for p in left:
            with contextlib.suppress(OSError, ValueError):
                getattr(p, stop)()
        left = wait_for_exit(1.0)
