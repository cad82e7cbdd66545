"""A remote task's fetched chunks on their way to a worker: into its slot's input half of the
arena (each distinct chunk once), or, without a slot (or with an executor that has no
shared memory), as bytes pickled with the task."""

from __future__ import annotations

from .arena import Arena
from .decode import chunk_keys
from .messages import Task


def input_bytes(task: Task) -> int:
    """The bytes of a task's fetched chunks in a slot's input half (each chunk once)."""
    raws = task.raws
    assert raws is not None
    keys = chunk_keys(task.refs)
    if keys is None:
        return sum(len(r) for r in raws)
    first: dict = {}
    for k, key in enumerate(keys):
        first.setdefault(key, k)
    return sum(len(raws[k]) for k in first.values())


def ship_inputs(task: Task, arena: Arena, slot: int) -> None:
    """Move a task's fetched chunks into its slot's input half, or else (no slot, or too big
    for it) make them bytes to pickle through the pipe; either way a chunk that several of
    its records share (group size > 1) goes once: one span, or one bytes object (pickle
    sends an object once)."""
    raws = task.raws
    assert raws is not None
    keys = chunk_keys(task.refs)
    spans = arena.place_inputs(slot, raws, keys) if slot >= 0 else None
    if spans is not None:
        task.raw_spans, task.raws = spans, None
    else:
        as_bytes(task)


def as_bytes(task: Task) -> None:
    """Make a task's fetched chunks bytes that pickle with it (views of this process's
    buffers do not): a chunk that several of its records share once (pickle sends an
    object once)."""
    raws = task.raws
    assert raws is not None
    keys = chunk_keys(task.refs)
    if keys is None:
        task.raws = [bytes(r) for r in raws]
        return
    blobs: dict = {}
    for key, r in zip(keys, raws):
        if key not in blobs:
            blobs[key] = bytes(r)
    task.raws = [blobs[key] for key in keys]
