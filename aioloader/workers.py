"""The decode pool: worker processes that turn fetched chunks into finished batches.

A task carries the raw chunk bytes (or already decoded records) for one batch or window; the
worker decodes, runs the record transforms, and collates inside the process, so that only
finished batches come back. Bytes travel through a shared-memory arena both ways: one file in
/dev/shm (private permissions, unique name) cut into slots that are reused for the life of
the pool, so no segment is created or unlinked per batch. A slot has an input half (the raw
chunks the parent fetched from a remote store, instead of pickling them through a pipe) and
an output half, where the worker stacks the batch's arrays. The parent hands the batch on as
views of the slot, without a copy, and the slot is reused once the consumer drops them. What
is not an array (strings, Python objects) is pickled into the slot after the arrays when it
is more than the pipe holds. What does not fit, or finds no free slot, travels by value
through the pipe instead. Local files are read by the workers themselves.

Workers are spawned (not forked: the parent runs an event loop and threads), and `workers=0`
runs the same task code on one thread of the parent, for debugging.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import multiprocessing
import multiprocessing.connection
import os
import pickle
import secrets
import tempfile
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrayrecord.chunk import DEFAULT_MAX_DECODED
from .arrayrecord.index import decode_records
from .planning import ChunkRefs
from .storage import ObjectChangedError, short_read_error
from .transforms import (
    BatchOp,
    MapOp,
    RecordOp,
    apply_batch_ops,
    apply_record_ops,
    collate,
)


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
    payload: Any  # batch mode: a list of batches (arrays may be _ShmRef); else the elements
    count: int  # elements that survived the filters
    slot: int = -1
    reads: int = 0  # local reads the worker made itself, and their bytes
    bytes_read: int = 0


@dataclass(frozen=True)
class _ShmRef:
    offset: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Pickled:
    """A payload pickled into its slot's output half (after the arrays placed there)."""

    offset: int
    size: int


@dataclass(frozen=True)
class _Blob:
    """A payload pickled by the worker, sent through the pipe as it is (small, or no room)."""

    data: bytes


# Payloads pickled smaller than this go through the pipe: it holds them whole.
_PIPE_BYTES = 64 << 10


# -- the code that runs in a worker ---------------------------------------------------

_pipeline: Pipeline | None = None
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


def _init_worker(pipeline_bytes: bytes, arena_path: str | None, slot_size: int) -> None:
    global _pipeline, _arena, _slot_size
    _raise_malloc_thresholds()
    _pipeline = pickle.loads(pipeline_bytes)
    _slot_size = slot_size
    _watch_parent(arena_path)
    if arena_path is not None:
        fd = os.open(arena_path, os.O_RDWR)
        try:
            _arena = mmap.mmap(fd, 0)
        finally:
            os.close(fd)


def _watch_parent(arena_path: str | None) -> None:
    """Exit (and free the arena) if the parent dies without closing us, e.g. on SIGKILL.

    Spawned workers would otherwise wait forever on the pool's queue, holding the shared
    memory and the resource tracker alive.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        if arena_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(arena_path)
        os._exit(1)

    threading.Thread(target=watch, name="aioloader-parent-watch", daemon=True).start()


class LocalFiles:
    """Descriptors of the local files a worker reads records from, each opened once.

    Reading in the worker, not the parent, keeps the parent's per-record work to a few
    vectorized lookups: the reads run in parallel across workers. The memory copy of a
    remote dataset (`ChunkRefs.shift` set, see aioloader.resident) is mapped instead, and its
    records are slices of the map: no system call per record. A disk file is never mapped:
    one truncated under us would kill the worker with SIGBUS instead of an error naming it;
    the memory copy is ours, sized once and never shrunk while the pool lives.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._maps: dict[str, memoryview] = {}
        self.reads = 0
        self.bytes = 0

    def _fd(self, url: str) -> int:
        fd = self._fds.get(url)
        if fd is None:
            path = url.removeprefix("file://")
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                raise ObjectChangedError(f"{path} was deleted after it was opened: re-open "
                                         "the dataset") from None
            self._fds[url] = fd
        return fd

    def _map(self, path: str) -> memoryview:
        view = self._maps.get(path)
        if view is None:
            view = self._maps[path] = memoryview(mmap.mmap(self._fd(path), 0,
                                                           access=mmap.ACCESS_READ))
        return view

    def read(self, refs: ChunkRefs) -> list:
        want = refs.end - refs.start
        starts, lengths = refs.start.tolist(), want.tolist()
        if refs.shift is None:
            pread, fds = os.pread, [self._fd(u) for u in refs.paths]
            out: list = [pread(fds[f], n, s) for f, s, n in
                         zip(refs.file.tolist(), starts, lengths)]
        else:  # the memory copy holds file f from shift[f] on
            at = refs.start + np.asarray(refs.shift, dtype=np.int64)[refs.file]
            maps = [self._map(u) for u in refs.paths]
            out = [maps[f][s : s + n] for f, s, n in
                   zip(refs.file.tolist(), at.tolist(), lengths)]
        got = np.fromiter(map(len, out), dtype=np.int64, count=len(out))
        if (got != want).any():
            k = int(np.flatnonzero(got != want)[0])
            raise short_read_error(refs.name(int(refs.file[k])), starts[k],
                                   int(refs.end[k]), int(got[k]))
        self.reads += len(out)
        self.bytes += int(want.sum())
        return out

    def close(self) -> None:
        for view in self._maps.values():
            mem = view.obj
            view.release()
            with contextlib.suppress(BufferError):  # slices still held: unmapped with them
                mem.close()  # type: ignore[attr-defined]
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


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
        batches = [apply_batch_ops(pipeline.batch_ops, collate(elements[i : i + size],
                                                               alloc=alloc))
                   for i in range(0, len(elements), size)]
        placed = alloc.export(batches) if alloc is not None else None
        if placed is None:  # no slot, or too big for it: the batches travel by value
            payload = _replace(batches, np.copy) if inline and alloc is not None else batches
            slot, room = -1, None
        else:
            payload, slot, room = placed, task.slot, alloc
    if not inline:  # what is not an array in the slot (strings, say) is pickled, once
        payload = _outgoing(payload, room)
    return Result(task.task_id, payload, len(elements), slot, **io)


def _room(arena: Any, slot: int, slot_size: int) -> _SlotAlloc | None:
    """The output half of `slot`, or None when there is no slot."""
    return _SlotAlloc(arena, slot * 2 * slot_size, slot_size) if arena is not None and \
        slot >= 0 else None


def _outgoing(payload: Any, room: _SlotAlloc | None) -> _Pickled | _Blob:
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
    placed = room.place(blob) if room is not None and len(blob) >= _PIPE_BYTES else None
    return placed or _Blob(blob)


class _SlotAlloc:
    """Hands out arrays inside one slot's output half, so that collate stacks the batch
    right where the parent will read it: no extra copy, and no fresh pages to fault in."""

    def __init__(self, buf: Any, base: int, size: int) -> None:
        self.buf, self.pos, self.end = buf, base, base + size
        self.made: dict[int, tuple[np.ndarray, _ShmRef]] = {}

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        dtype = np.dtype(dtype)
        n = _aligned(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        if dtype.hasobject or self.pos + n > self.end:
            return None
        a = np.ndarray(shape, dtype=dtype, buffer=self.buf, offset=self.pos)
        self.made[id(a)] = (a, _ShmRef(self.pos, dtype.str, tuple(shape)))
        self.pos += n
        return a

    def place(self, blob: bytes) -> _Pickled | None:
        """`blob` copied in after the arrays; None if it does not fit."""
        n = len(blob)
        if self.pos + n > self.end:
            return None
        self.buf[self.pos : self.pos + n] = blob
        return _Pickled(self.pos, n)

    def export(self, batch: Any) -> Any:
        """The batch with its arrays as references into the slot; None if they don't fit.

        Arrays collate placed are referenced as they are; others (made by a batch op) are
        copied in.
        """
        leaves: list[np.ndarray] = []
        _collect(batch, leaves)
        refs = {}
        for a in leaves:
            made = self.made.get(id(a))
            if made is None or made[0] is not a:
                dst = self(a.shape, a.dtype)
                if dst is None:
                    return None
                dst[...] = a
                made = self.made[id(dst)]
            refs[id(a)] = made[1]
        return _replace(batch, lambda a: refs.get(id(a), a))


def _aligned(n: int) -> int:
    return (n + 63) & ~63


def _is_leaf_list(tree: list) -> bool:
    """A list of str/bytes (collated text): nothing to place, don't walk it."""
    return bool(tree) and isinstance(tree[0], (str, bytes))


def _collect(tree: Any, out: list) -> None:
    if isinstance(tree, dict):
        for v in tree.values():
            _collect(v, out)
    elif isinstance(tree, (tuple, list)):
        if not (isinstance(tree, list) and _is_leaf_list(tree)):
            for v in tree:
                _collect(v, out)
    elif isinstance(tree, np.ndarray) and tree.dtype != object:
        out.append(tree)


def array_leaves(tree: Any) -> list[np.ndarray]:
    """The NumPy arrays (not object arrays) in a batch's tree of dicts, tuples and lists."""
    out: list[np.ndarray] = []
    _collect(tree, out)
    return out


def _replace(tree: Any, fn) -> Any:
    if isinstance(tree, dict):
        return {k: _replace(v, fn) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_replace(v, fn) for v in tree)
    if isinstance(tree, list):
        return tree if _is_leaf_list(tree) else [_replace(v, fn) for v in tree]
    if isinstance(tree, (np.ndarray, _ShmRef)):
        return fn(tree)
    return tree


# -- the parent's side ----------------------------------------------------------------


def _retrieve(fut: asyncio.Future) -> None:
    """Mark a future's exception as seen (its waiter may have been cancelled)."""
    if not fut.cancelled():
        fut.exception()


class Arena:
    """The parent's shared-memory file: `slots` reusable slots, each an output half and an
    input half of `slot_size` bytes (pages are only allocated when touched)."""

    def __init__(self, slots: int, slot_size: int) -> None:
        root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        self.path = os.path.join(root, f"aioloader-{os.getpid()}-{secrets.token_hex(6)}")
        self.slot_size = slot_size
        self.free = list(range(slots))
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, slots * 2 * slot_size)
            self.map = mmap.mmap(fd, slots * 2 * slot_size)
        finally:
            os.close(fd)

    def place_inputs(self, slot: int, raws: list) -> list[tuple[int, int]] | None:
        """Copy raw chunks into the slot's input half; None if they do not fit."""
        if sum(len(r) for r in raws) > self.slot_size:
            return None
        pos = (2 * slot + 1) * self.slot_size
        spans = []
        for r in raws:
            n = len(r)
            self.map[pos : pos + n] = r
            spans.append((pos, n))
            pos += n
        return spans

    def take(self) -> int:
        """A free slot, or -1 if every slot is busy or lent (the task then goes by value)."""
        try:
            return self.free.pop()
        except IndexError:
            return -1

    def unpickle(self, ref: _Pickled | _Blob) -> Any:
        """A payload a worker pickled (see `_outgoing`), from its slot or as sent."""
        if isinstance(ref, _Blob):
            return pickle.loads(ref.data)
        with memoryview(self.map) as view:
            return pickle.loads(view[ref.offset : ref.offset + ref.size])

    def give(self, slot: int) -> None:
        """Return a slot; safe from any thread (a list append is atomic)."""
        if slot >= 0:
            self.free.append(slot)

    def lend(self, batch: Any, slot: int) -> Any:
        """The batch's arrays as views of `slot`, without a copy; the slot comes back when
        the last of them is garbage (so a consumer that keeps batches only costs slots)."""
        base = 2 * slot * self.slot_size
        slab = np.frombuffer(self.map, dtype=np.uint8, count=self.slot_size, offset=base)
        weakref.finalize(slab, self.give, slot).atexit = False

        def load(ref: Any) -> Any:
            if not isinstance(ref, _ShmRef):
                return ref
            dtype = np.dtype(ref.dtype)
            lo = ref.offset - base
            n = int(np.prod(ref.shape, dtype=np.int64)) * dtype.itemsize
            return slab[lo : lo + n].view(dtype).reshape(ref.shape)

        return _replace(batch, load)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still exported: unlink regardless
            self.map.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _context() -> multiprocessing.context.BaseContext:
    """forkserver where there is one (Linux): the first pool starts one clean server process
    with NumPy and this module loaded, and every worker after that is a fork of it (a few
    ms instead of a fresh interpreter's ~0.15 s); spawn elsewhere. Never plain fork: the
    parent runs an event loop and threads."""
    if "forkserver" in multiprocessing.get_all_start_methods():
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
        self._procs: list = []
        self._files = LocalFiles()  # the inline worker's (workers == 0)
        self.arena = Arena(slots, slot_size)
        if workers == 0:
            self._executor: Any = ThreadPoolExecutor(1, thread_name_prefix="aioloader-inline")
            _raise_malloc_thresholds()
            return
        try:
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=_context(),
                initializer=_init_worker,
                initargs=(pickle.dumps(pipeline), self.arena.path, slot_size),
            )
        except BaseException:
            self.arena.close()
            raise

    def warm_up(self) -> None:
        """Start the worker processes now (spawning takes a while) instead of on first use."""
        if self.workers:
            for _ in range(self.workers):
                self._executor.submit(os.getpid)
            self._procs = list((getattr(self._executor, "_processes", None) or {}).values())

    async def run(self, task: Task, describe: str = "") -> Result:
        """Run one task; a batch comes back as views of its arena slot (see `Arena.lend`)."""
        arena = self.arena
        slot = task.slot = arena.take()
        lent = False
        cf = None
        try:
            if self.workers == 0:
                cf = self._executor.submit(run_task, task, self.pipeline, self._files,
                                           arena.map, arena.slot_size)
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
            if isinstance(result.payload, (_Pickled, _Blob)):
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

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._files.close()
        self.arena.close()
