"""The decode pool: worker processes that turn fetched chunks into finished batches.

A task carries the raw chunk bytes (or already decoded records) for one batch or window; the
worker decodes, runs the record transforms, and collates inside the process, so that only
finished batches come back. Bytes travel through a shared-memory arena both ways: one file in
/dev/shm (private permissions, unique name) cut into slots that are reused for the life of
the pool, so no segment is created or unlinked per batch. A slot has an input half (the raw
chunks the parent fetched, instead of pickling them through a pipe) and an output half (the
batch's arrays); the parent copies the batch out and frees the slot. What does not fit its
half travels inline instead.

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
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrayrecord.index import decode_chunk
from .planning import ChunkRefs
from .storage import ObjectChangedError, short_read_error
from .transforms import (
    DROP,
    BatchOp,
    MapOp,
    RecordOp,
    apply_batch_ops,
    apply_record_ops,
    collate,
)


class WorkerError(RuntimeError):
    """A worker process died; the message says which batch it was working on."""


@dataclass(frozen=True)
class Pipeline:
    """What every worker runs (sent once, when the pool starts)."""

    record_ops: tuple[RecordOp, ...]
    batch: BatchOp | None  # collate in the worker; None: return elements (filter/pack mode)
    batch_ops: tuple[MapOp, ...]
    verify: str = "headers"


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
    payload: Any  # a batch (arrays may be _ShmRef), a list of elements, or None if all dropped
    count: int  # elements that survived the filters
    slot: int = -1
    reads: int = 0  # local reads the worker made itself, and their bytes
    bytes_read: int = 0


@dataclass(frozen=True)
class _ShmRef:
    offset: int
    dtype: str
    shape: tuple[int, ...]


# -- the code that runs in a worker ---------------------------------------------------

_pipeline: Pipeline | None = None
_arena: mmap.mmap | None = None
_slot_size = 0


def _init_worker(pipeline_bytes: bytes, arena_path: str | None, slot_size: int) -> None:
    global _pipeline, _arena, _slot_size
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
    vectorized lookups: the reads run in parallel across workers.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
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

    def read(self, refs: ChunkRefs) -> list[bytes]:
        fds = [self._fd(u) for u in refs.paths]
        pread = os.pread
        out = [pread(fds[f], e - s, s) for f, s, e in
               zip(refs.file.tolist(), refs.start.tolist(), refs.end.tolist())]
        want = refs.end - refs.start
        got = np.fromiter(map(len, out), dtype=np.int64, count=len(out))
        if (got != want).any():
            k = int(np.flatnonzero(got != want)[0])
            raise short_read_error(refs.paths[int(refs.file[k])], int(refs.start[k]),
                                   int(refs.end[k]), int(got[k]))
        self.reads += len(out)
        self.bytes += int(want.sum())
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


_files = LocalFiles()


def _records_of(task: Task, verify: str, files: LocalFiles) -> list[bytes]:
    if task.records is not None:
        return task.records
    refs = task.refs
    assert refs is not None
    if task.raw_spans is not None:
        view = memoryview(_arena)  # type: ignore[arg-type]
        raws: list = [view[o : o + n] for o, n in task.raw_spans]
    elif task.raws is not None:
        raws = task.raws
    else:
        raws = files.read(refs)
    out = []
    paths = refs.paths
    for raw, f, start, c, j in zip(raws, refs.file.tolist(), refs.start.tolist(),
                                   refs.chunk.tolist(), refs.within.tolist()):
        _, records = decode_chunk(raw, start, verify=verify, path=paths[f], chunk=c)
        out.append(records.record(j))
    return out


def run_task(task: Task, pipeline: Pipeline | None = None, files: LocalFiles | None = None
             ) -> Result:
    """Decode, transform and (in batch mode) collate one task."""
    pipeline = pipeline or _pipeline
    assert pipeline is not None, "worker not initialised"
    files = files or _files
    reads, nbytes = files.reads, files.bytes
    records = _records_of(task, pipeline.verify, files)
    io = {"reads": files.reads - reads, "bytes_read": files.bytes - nbytes}
    elements = []
    idx, ep = task.indices.tolist(), task.epochs.tolist()
    refs = task.refs
    paths = ([refs.paths[f] for f in refs.file.tolist()] if refs is not None
             else [""] * len(records))
    for record, i, e, path in zip(records, idx, ep, paths):
        out = apply_record_ops(pipeline.record_ops, record, i, e, path)
        if out is not DROP:
            elements.append(out)
    if pipeline.batch is None:
        return Result(task.task_id, elements, len(elements), **io)
    if not elements:
        return Result(task.task_id, None, 0, **io)
    batch = apply_batch_ops(pipeline.batch_ops, collate(elements))
    if _arena is not None and task.slot >= 0:
        batch = _to_arena(batch, _arena, task.slot * 2 * _slot_size, _slot_size)
    return Result(task.task_id, batch, len(elements), task.slot, **io)


def _to_arena(batch: Any, arena: Any, base: int, size: int) -> Any:
    """Copy the batch's arrays into the slot at `base`; keep it inline if it does not fit."""
    leaves: list[np.ndarray] = []
    _collect(batch, leaves)
    need = sum(_aligned(a.nbytes) for a in leaves)
    if need > size:
        return batch
    pos = base
    refs = {}
    for a in leaves:
        view = np.ndarray(a.shape, dtype=a.dtype, buffer=arena, offset=pos)
        view[...] = a
        refs[id(a)] = _ShmRef(pos, a.dtype.str, a.shape)
        pos += _aligned(a.nbytes)
    return _replace(batch, lambda a: refs.get(id(a), a))


def _aligned(n: int) -> int:
    return (n + 63) & ~63


def _collect(tree: Any, out: list) -> None:
    if isinstance(tree, dict):
        for v in tree.values():
            _collect(v, out)
    elif isinstance(tree, (tuple, list)):
        for v in tree:
            _collect(v, out)
    elif isinstance(tree, np.ndarray) and tree.dtype != object:
        out.append(tree)


def _replace(tree: Any, fn) -> Any:
    if isinstance(tree, dict):
        return {k: _replace(v, fn) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_replace(v, fn) for v in tree)
    if isinstance(tree, list):
        return [_replace(v, fn) for v in tree]
    if isinstance(tree, (np.ndarray, _ShmRef)):
        return fn(tree)
    return tree


# -- the parent's side ----------------------------------------------------------------


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

    def materialize(self, batch: Any) -> Any:
        """Copy a batch's arrays out of the arena (so its slot can be reused)."""
        def load(ref: Any) -> Any:
            if not isinstance(ref, _ShmRef):
                return ref
            view = np.ndarray(ref.shape, dtype=np.dtype(ref.dtype), buffer=self.map,
                              offset=ref.offset)
            return view.copy()

        return _replace(batch, load)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still exported: unlink regardless
            self.map.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class Pool:
    """Runs tasks in `workers` processes (or inline on one thread when workers == 0)."""

    def __init__(self, pipeline: Pipeline, workers: int, *, slots: int,
                 slot_size: int = 32 << 20) -> None:
        self.pipeline = pipeline
        self.workers = workers
        self.arena: Arena | None = None
        self._slot_waiters: list[asyncio.Future] = []
        self._procs: list = []

        self._files = LocalFiles()  # the inline worker's (workers == 0)
        if workers == 0:
            self._executor: Any = ThreadPoolExecutor(1, thread_name_prefix="aioloader-inline")
            return
        self.arena = Arena(slots, slot_size)
        try:
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
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

    async def _take_slot(self) -> int:
        assert self.arena is not None
        while not self.arena.free:
            fut = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(fut)
            await fut
        return self.arena.free.pop()

    def _give_slot(self, slot: int) -> None:
        if slot < 0 or self.arena is None:
            return
        self.arena.free.append(slot)
        while self._slot_waiters:
            fut = self._slot_waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                break

    async def run(self, task: Task, describe: str = "") -> Result:
        """Run one task; arrays come back materialized (slot already freed)."""
        loop = asyncio.get_running_loop()
        if self.workers == 0:
            return await loop.run_in_executor(self._executor, run_task, task, self.pipeline,
                                              self._files)
        task.slot = await self._take_slot()
        if task.raws is not None:
            spans = self.arena.place_inputs(task.slot, task.raws)  # type: ignore[union-attr]
            if spans is not None:
                task.raw_spans, task.raws = spans, None
            else:  # too big for the slot: pickle them through the pipe
                task.raws = [bytes(r) for r in task.raws]
        try:
            result = await asyncio.wrap_future(self._executor.submit(run_task, task))
            if result.payload is not None and self.pipeline.batch is not None:
                result.payload = self.arena.materialize(result.payload)  # type: ignore[union-attr]
            return result
        except BrokenProcessPool:
            raise WorkerError(
                f"a worker process died while processing {describe or f'task {task.task_id}'}"
                f"{self._exit_codes()}; the loader cannot continue (restart it from the last "
                "state; if a transform crashes the interpreter, run with workers=0 to debug)"
            ) from None
        finally:
            self._give_slot(task.slot)

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
        if self.arena is not None:
            self.arena.close()
            self.arena = None
