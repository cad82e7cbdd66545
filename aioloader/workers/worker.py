"""What a worker process runs: its start-up, and `run_task` over the messages it receives
and returns (`aioloader.workers.messages`).

A task says where the records of one batch or window lie (their chunks), with the fetched
chunk bytes for remote files (local files the worker reads itself), whatever the group size;
the worker decodes (`aioloader.workers.decode`), runs the record transforms, timing each, and
collates inside the process, stacking the batch's arrays right in its slot of the
shared-memory arena (`aioloader.workers.arena`). The parent's side, the pool that sends tasks
and hands results on, is `aioloader.workers.pool`; `workers=0` runs `run_task` on a thread of
the parent with the pool's own pipeline, decoder and arena.

A worker that cannot load the pipeline (a transform it cannot unpickle) stays up and fails
every task with the cause, naming the transform, instead of dying.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from typing import Any

import numpy as np

from ..describe.objects import read_records
from ..elements.collate import collate_named
from ..elements.transforms import OpTimes, apply_batch_ops, apply_record_ops, dumps_op
from ..errors import WorkerError
from . import rows, stacking
from .arena import PIPE_BYTES, Blob, Pickled, SlotAlloc, needed_bytes, replace_leaves, slot_bytes
from .decode import Decoder
from .messages import DEFAULT_CHUNK_CACHE_BYTES, Pipeline, Result, Task
from .pieces import has_arrays, window_payload

# A pickled payload this large that does not fit its slot grows the arena rather than take
# the pipe (smaller ones take the pipe: a few of its buffers).
GROW_BYTES = 1 << 20

_pipeline: Pipeline | None = None
_decoder: Decoder | None = None
_init_error: str | None = None
_arena: mmap.mmap | None = None  # the arena generation the last task named (`_map`)
_arena_path: str | None = None
_unlink: list[str] = []  # named arena files (no memfd) to remove if the parent dies


def _raise_malloc_thresholds() -> None:
    """Free one 16 MiB block, so that glibc raises its mmap and trim thresholds, as it does
    in any process after a large free.

    Every record is a fresh ~record-sized buffer (the read, then the decoded record). With
    the initial thresholds, a process (or thread) that never freed a large block trims its
    heap after each batch and faults the same pages back in on the next: measured, 64 KiB
    records decoded 1.5-2.5x slower than in a warmed-up process. Elsewhere this is a no-op.
    The block is `np.empty` (malloc, never written), not a `bytearray` (zero-filled): glibc
    raises the thresholds on the free of any mmapped block, and faulting 16 MiB in would
    cost the first batch's path its time.
    """
    block = np.empty(16 << 20, np.uint8)  # below glibc's 32 MiB cap for the threshold
    del block


def _init_worker(pipeline_parts: tuple, started: Any = None,
                 cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
                 environ: dict[str, str] | None = None) -> None:
    """Load the pipeline; what fails is kept (`_init_error`) and raised by every task, so
    the parent gets the cause at once instead of a dead worker. Releases `started`: this
    worker has opened the pool's semaphores (`Pool._forget_names`). `cache_bytes`: this
    worker's share of the decoded-chunk cache. The arena is mapped when a task names it.
    `environ`: the parent's environment when it made the pool, which transforms see (a
    fork of the forkserver has the forkserver's, from when it started)."""
    global _pipeline, _init_error, _decoder
    if environ is not None and environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)
    if started is not None:
        started.release()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _raise_malloc_thresholds()
    _decoder = Decoder(cache_bytes)
    _watch_parent()
    try:
        _pipeline = _load_pipeline(pipeline_parts)
    except WorkerError as exc:
        _init_error = str(exc)
    except Exception as exc:
        _init_error = f"a worker process could not start ({type(exc).__name__}: {exc})"


def _map(where: tuple[str, int, bool]) -> mmap.mmap:
    """The arena generation at `where` (`Arena.where`), mapped once; the previous one is
    let go (the parent only grows the arena: tasks never name an older one again)."""
    global _arena, _arena_path
    path, _, named = where
    if path != _arena_path:
        old, _arena, _arena_path = _arena, None, None
        if old is not None:
            with contextlib.suppress(BufferError):
                old.close()
        fd = os.open(path, os.O_RDWR)
        try:
            _arena = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        _arena_path = path
        if named:
            _unlink.append(path)
    assert _arena is not None
    return _arena


def _pack_pipeline(pipeline: Pipeline) -> tuple:
    """The pipeline pickled op by op (with each op's description), and a `from_source()`
    object apart, so that a worker that cannot unpickle one can say which
    (`_load_pipeline`)."""
    rest = dataclasses.replace(pipeline, record_ops=(), batch_ops=(), records=None)
    records = pipeline.records
    source = (None if records is None else
              (f"the source <{type(records).__qualname__}>", dumps_op(records)))
    return (pickle.dumps(rest), [(op.describe(), dumps_op(op)) for op in pipeline.record_ops],
            [(op.describe(), dumps_op(op)) for op in pipeline.batch_ops], source)


def _load_pipeline(parts: tuple) -> Pipeline:
    rest, record_ops, batch_ops, source = parts

    def load(describe: str, blob: bytes) -> Any:
        try:
            return pickle.loads(blob)
        except Exception as exc:
            raise WorkerError(
                f"{describe} cannot be loaded in a worker process ({type(exc).__name__}: "
                f"{exc}); make sure what it uses is importable in a fresh interpreter (a "
                "module on sys.path), or use workers=0") from None

    return dataclasses.replace(load("the pipeline", rest),
                               record_ops=tuple(load(*op) for op in record_ops),
                               batch_ops=tuple(load(*op) for op in batch_ops),
                               records=None if source is None else load(*source))


def _watch_parent() -> None:
    """Exit if the parent dies without closing us, e.g. on SIGKILL (and remove the arena's
    names where they have one: without memfd, see `aioloader.io.memfile`).

    Spawned workers would otherwise wait forever on the pool's queue, holding the shared
    memory and the resource tracker alive.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        for path in list(_unlink):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os._exit(1)

    threading.Thread(target=watch, name="aioloader-parent-watch", daemon=True).start()


def _records_of(task: Task, pipeline: Pipeline, decoder: Decoder, arena: Any,
                paths: list[str]) -> list[bytes]:
    """The task's records, decoded; `paths` names each record's file in errors."""
    if pipeline.records is not None:  # a from_source() object: read by index
        return read_records(pipeline.records, task.indices.tolist())
    return decoder.records(task.refs, task.chunk_bytes(arena), verify=pipeline.verify,
                           max_decoded=pipeline.max_decoded, paths=paths, stash=task.stash,
                           table=task.table)


def run_task(task: Task, pipeline: Pipeline | None = None, decoder: Decoder | None = None,
             arena: tuple[Any, int, int] | None = None, sendable: bool = False, *,
             worker: bool = False) -> Result:
    """Decode, transform and (in batch mode) collate one task.

    In a worker process the pipeline, decoder and arena are this process's globals (the
    arena generation the task names, `Task.arena`); the inline pool (workers=0) passes its
    own, and `arena` as (map, slot size, the slot's place in it); `sendable`: check that the
    result could come back from a worker, as a task the pool runs in the parent while its
    workers start must (what is not an array is pickled: the same error either way).
    `worker`: with the pipeline and decoder given, run as a worker process does (the arena
    the task names, what is not an array pickled): a Ray actor on the parent's host.

    A worker whose output does not fit the slot it was given sends nothing back but the
    room it needs (`Result.needed`): the pool grows the arena and runs the task again, so
    that big batches too come back through shared memory, never a pipe.
    """
    began = time.perf_counter_ns()
    inline = pipeline is not None and not worker
    if not inline and _init_error is not None:
        raise WorkerError(_init_error)
    pipeline = pipeline or _pipeline
    decoder = decoder or _decoder
    assert pipeline is not None and decoder is not None, "worker not initialised"
    if not inline and task.arena is not None:
        path, size, _, place = task.arena
        arena = (_map((path, size, _)), size, place)
    mem = arena[0] if arena is not None else None
    if task.fill is not None:  # a fill job of the shared stash (`workers.extract`)
        if task.contexts:  # (a contextual format's chunk: its file's context comes along)
            decoder.states.learn(task.refs, task.table, task.contexts,
                                 max_decoded=pipeline.max_decoded)
        return _filled(task, pipeline, decoder, mem, began)
    if pipeline.records is None:  # files of a contextual format: their states first
        if task.contexts:
            decoder.states.learn(task.refs, task.table, task.contexts,
                                 max_decoded=pipeline.max_decoded)
        missing = decoder.states.lacking(task.refs, task.table)
        if missing:  # (nothing ran: the task comes back with these files' contexts)
            return Result(task.task_id, None, 0, missing=missing)
    files = decoder.files
    reads, nbytes = files.reads, files.bytes
    refs = task.refs
    names = refs.names or refs.paths  # (what `refs.name` gives, without a call a record)
    paths = [names[f] for f in refs.file.tolist()]
    times = OpTimes.zeros(len(pipeline.record_ops) + len(pipeline.batch_ops))
    survivors = None
    alloc = _room(arena, task.slot)
    raws = task.chunk_bytes(mem)
    if alloc is not None and rows.applies(pipeline):  # typed records: into their rows
        made = rows.typed_batches(task, pipeline, decoder, raws, paths, alloc, times)
    else:
        made = stacking.in_pieces(task, pipeline, decoder, raws, paths, alloc, times)
    if made is not None:  # big batches: straight into the slot, a piece at a time
        payload, spent = made
        decoded, count = began + spent, len(refs)
    else:
        if any(times.items) or (alloc is not None and alloc.made):  # pieces tried: afresh
            times = OpTimes.zeros(len(times.items))
            alloc = _room(arena, task.slot)
        payload, survivors, count, decoded = _whole(task, pipeline, decoder, mem, paths,
                                                    alloc, times)
    io: dict[str, Any] = {"reads": files.reads - reads, "bytes_read": files.bytes - nbytes,
                          "chunks_decoded": decoder.decoded, "chunk_hits": decoder.hits,
                          "stash_missed": decoder.missed}
    slot, room = -1, alloc  # stream mode's plain elements: pickled (into the slot if big)
    # the largest batch's bytes, for the parent's task sizes: measured here, where its
    # strings were just made (the parent would walk them again, out of the cache)
    largest = max(map(slot_bytes, payload), default=0) if pipeline.batch is not None else -1
    if pipeline.batch is not None or has_arrays(payload):
        placed = alloc.export(payload) if alloc is not None else None
        if placed is not None:
            payload, slot = placed, task.slot
        elif alloc is not None and not inline:  # a slot too small for it: ask for room
            return Result(task.task_id, None, 0, needed=needed_bytes(payload))
        else:  # no slot: the arrays travel by value (copies of those placed in the slot)
            if alloc is not None and alloc.made:
                payload = replace_leaves(payload, np.copy)
            room = None
    if sendable:
        _outgoing(replace_leaves(payload, _objects_only), None)
    if not inline:  # what is not an array in the slot (strings, say) is pickled, once
        payload = _outgoing(payload, room)  # type: ignore[assignment]
        if isinstance(payload, int):
            return Result(task.task_id, None, 0, needed=payload)
    return Result(task.task_id, payload, count, slot, **io, survivors=survivors,
                  largest=largest,
                  op_items=times.items, op_seconds=times.seconds, pid=os.getpid(),
                  tid=threading.get_native_id(), began_ns=began, decoded_ns=decoded,
                  ended_ns=time.perf_counter_ns())


def _filled(task: Task, pipeline: Pipeline, decoder: Decoder, mem: Any, began: int) -> Result:
    """A fill job run: its chunk's wanted records laid out in the stash file; `count`: how
    many went in."""
    reads, nbytes = decoder.files.reads, decoder.files.bytes
    decoder.decoded = decoder.hits = 0
    count = decoder.fill(task.refs, task.chunk_bytes(mem), task.fill,  # type: ignore[arg-type]  # a fill
                         verify=pipeline.verify, max_decoded=pipeline.max_decoded,
                         table=task.table)
    return Result(task.task_id, None, count, reads=decoder.files.reads - reads,
                  bytes_read=decoder.files.bytes - nbytes, chunks_decoded=decoder.decoded,
                  chunk_hits=decoder.hits, spilled=decoder.spilled, pid=os.getpid(),
                  tid=threading.get_native_id(), began_ns=began, ended_ns=time.perf_counter_ns())


def _whole(task: Task, pipeline: Pipeline, decoder: Decoder, mem: Any, paths: list[str],
           alloc: SlotAlloc | None, times: OpTimes
           ) -> tuple[Any, np.ndarray | None, int, int]:
    """A task's output made whole: every record decoded, then each op over all of them,
    then each batch collated (or, in stream mode, the window's survivors); with the
    survivors' places (stream mode), the count of elements, and when the records were
    decoded (`time.perf_counter_ns()`)."""
    records = _records_of(task, pipeline, decoder, mem, paths)
    decoded = time.perf_counter_ns()
    kept: list[int] = []  # the survivors' places in the task (stream mode's resume tags)
    elements = apply_record_ops(pipeline.record_ops, records, task.indices.tolist(),
                                task.epochs.tolist(), paths, times=times, survivors=kept)
    del records
    if pipeline.batch is None:  # stream mode: the task's survivors (`pieces`)
        return (window_payload(elements, pipeline.stream, alloc),
                np.asarray(kept, dtype=np.int32), len(elements), decoded)
    # the task's elements are one or more whole batches (the last may be short)
    size = pipeline.batch.size
    indices, epochs = task.indices, task.epochs

    def record(k: int) -> str:
        where = f" in {paths[k]}" if paths and paths[k] else ""
        return f"record {indices[k]} (epoch {epochs[k]}){where}"

    pad, masks = pipeline.batch.rules, pipeline.batch.masks
    return [apply_batch_ops(pipeline.batch_ops, collate_named(
                elements[i : i + size], lambda k, i=i: record(i + k), alloc=alloc,  # type: ignore[misc]
                pad=pad, masks=masks),
                times=times, first=len(pipeline.record_ops))
            for i in range(0, len(elements), size)], None, len(elements), decoded


def _objects_only(a: Any) -> Any:
    """Arrays of objects as they are (they pickle their items), other arrays gone."""
    return a if isinstance(a, np.ndarray) and a.dtype.hasobject else None


def _room(arena: tuple[Any, int, int] | None, slot: int) -> SlotAlloc | None:
    """The output half of the task's slot, or None when there is no slot."""
    if arena is None or slot < 0:
        return None
    mem, size, place = arena
    return SlotAlloc(mem, place * 2 * size, size)


def _outgoing(payload: Any, room: SlotAlloc | None) -> Pickled | Blob | int:
    """`payload` pickled once, in the worker: into the rest of its slot when it is more than
    the pipe holds and fits (the parent unpickles it from shared memory, instead of both
    processes copying it through a 64 KiB pipe a buffer at a time), else as bytes for the
    pipe. Either way the parent unpickles it (`Arena.unpickle`). More than `GROW_BYTES` that
    does not fit the slot: the bytes the slot would need (the pool grows the arena)."""
    try:
        blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise WorkerError(
            f"a worker cannot send its result back ({type(exc).__name__}: {exc}): what "
            "transforms return in worker processes must pickle (arrays, numbers, strings, "
            "and dicts, lists or tuples of them); convert it in the transform, or run "
            "with workers=0") from None
    placed = room.place(blob) if room is not None and len(blob) >= PIPE_BYTES else None
    if placed is None and room is not None and len(blob) >= GROW_BYTES:
        return room.used + len(blob)
    return placed or Blob(blob)
