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
from typing import Any

import numpy as np

from ..errors import WorkerError
from ..transforms import (
    OpTimes,
    apply_batch_ops,
    apply_record_ops,
    collate_named,
)
from .arena import PIPE_BYTES, Blob, Pickled, SlotAlloc, replace_leaves
from .decode import Decoder
from .messages import DEFAULT_CHUNK_CACHE_BYTES, Pipeline, Result, Task
from .pieces import has_arrays, window_payload

_pipeline: Pipeline | None = None
_decoder: Decoder | None = None
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
                 unlink_path: str | None = None, started: Any = None,
                 cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES) -> None:
    """Load the pipeline and map the arena; what fails is kept (`_init_error`) and raised
    by every task, so the parent gets the cause at once instead of a dead worker. Releases
    `started`: this worker has opened the pool's semaphores (`Pool._forget_names`).
    `cache_bytes`: this worker's share of the decoded-chunk cache."""
    global _pipeline, _arena, _slot_size, _init_error, _decoder
    if started is not None:
        started.release()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _raise_malloc_thresholds()
    _slot_size = slot_size
    _decoder = Decoder(cache_bytes)
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


def _records_of(task: Task, pipeline: Pipeline, decoder: Decoder, arena: Any,
                paths: list[str]) -> list[bytes]:
    """The task's records, decoded; `paths` names each record's file in errors."""
    raws = task.raws
    if task.raw_spans is not None:
        view = memoryview(arena)
        raws = [view[o : o + n] for o, n in task.raw_spans]
    return decoder.records(task.refs, raws, verify=pipeline.verify,
                           max_decoded=pipeline.max_decoded, paths=paths)


def run_task(task: Task, pipeline: Pipeline | None = None, decoder: Decoder | None = None,
             arena: Any = None, slot_size: int = 0) -> Result:
    """Decode, transform and (in batch mode) collate one task.

    In a worker process the pipeline, decoder and arena are this process's globals; the
    inline pool (workers=0) passes its own.
    """
    inline = pipeline is not None
    if not inline and _init_error is not None:
        raise WorkerError(_init_error)
    pipeline = pipeline or _pipeline
    decoder = decoder or _decoder
    assert pipeline is not None and decoder is not None, "worker not initialised"
    arena = arena if inline else _arena
    slot_size = slot_size if inline else _slot_size
    files = decoder.files
    reads, nbytes = files.reads, files.bytes
    refs = task.refs
    paths = [refs.name(f) for f in refs.file.tolist()]
    records = _records_of(task, pipeline, decoder, arena, paths)
    io = {"reads": files.reads - reads, "bytes_read": files.bytes - nbytes,
          "chunks_decoded": decoder.decoded, "chunk_hits": decoder.hits}
    times = OpTimes.zeros(len(pipeline.record_ops) + len(pipeline.batch_ops))
    kept: list[int] = []  # the survivors' places in the task (stream mode's resume tags)
    elements = apply_record_ops(pipeline.record_ops, records, task.indices.tolist(),
                                task.epochs.tolist(), paths, times=times, survivors=kept)
    survivors = None
    if pipeline.batch is None:  # stream mode: the task's survivors (`pieces`)
        survivors = np.asarray(kept, dtype=np.int32)
        payload, slot, room = _stream_payload(elements, pipeline, arena, task.slot, slot_size,
                                              inline)
    else:  # the task's elements are one or more whole batches (the last may be short)
        size = pipeline.batch.size
        alloc = _room(arena, task.slot, slot_size)
        indices, epochs = task.indices, task.epochs

        def record(k: int) -> str:
            where = f" in {paths[k]}" if paths and paths[k] else ""
            return f"record {indices[k]} (epoch {epochs[k]}){where}"

        batches = [apply_batch_ops(pipeline.batch_ops, collate_named(
                       elements[i : i + size], lambda k, i=i: record(i + k), alloc=alloc),
                       times=times, first=len(pipeline.record_ops))
                   for i in range(0, len(elements), size)]
        placed = alloc.export(batches) if alloc is not None else None
        if placed is None:  # no slot, or too big for it: the batches travel by value
            payload = replace_leaves(batches, np.copy) if inline and alloc is not None else batches
            slot, room = -1, None
        else:
            payload, slot, room = placed, task.slot, alloc
    if not inline:  # what is not an array in the slot (strings, say) is pickled, once
        payload = _outgoing(payload, room)
    return Result(task.task_id, payload, len(elements), slot, **io, survivors=survivors,
                  op_items=times.items, op_seconds=times.seconds)


def _stream_payload(elements: list, pipeline: Pipeline, arena: Any, slot: int,
                    slot_size: int, inline: bool) -> tuple[Any, int, SlotAlloc | None]:
    """(payload, slot, room) of a stream-mode task: columns or packing pieces with their
    arrays in the slot where they fit (by value where not), else the elements."""
    alloc = _room(arena, slot, slot_size)
    payload = window_payload(elements, pipeline.stream, alloc)
    if not has_arrays(payload):  # the elements, pickled (into the slot if big)
        return payload, -1, alloc
    placed = alloc.export(payload) if alloc is not None else None
    if placed is None:  # no slot, or too big for it: by value (a copy of what is in it)
        return (replace_leaves(payload, np.copy) if inline and alloc is not None else payload,
                -1, None)
    return placed, slot, alloc


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
