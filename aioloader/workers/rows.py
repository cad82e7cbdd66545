"""Typed records decoded straight into their batch's rows.

A pipeline whose one record op is the typed decode (`from_arrayrecord(decode=spec)`) of fixed
size numeric fields, batched without padding, needs no transform per record: each record is
the spec's bytes, and its batch is those bytes laid out as arrays. So a batch's records are
decoded into one (records, bytes a record) byte matrix: each record of a local one-record
chunk is decoded and copied into its row at once, while still in the cache (`Decoder.into`),
other records decoded (each chunk once a task), then copied in. For one unnamed array that
matrix is the batch itself, in the slot; named fields are cut out of it with one strided
copy a field. Decode, then collate, would copy each record twice more. Such a task is
never made in pieces (`stacking`): its records take no memory beyond the batch.

The output is the one the general path makes (`tests/workers/test_rows.py`): the arrays
collate allocates (native byte order), in the spec's field order. A slot without room for
the task's batches (found before anything is decoded), a record not of the spec's size, or
anything that raises gives None, and the caller makes the task the general way, which asks
for room, or decodes it again and names the error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..elements.transforms import MapOp, OpTimes, apply_batch_ops
from ..elements.typed import BYTES, Decode, ElementSpec
from .arena import SlotAlloc
from .decode import Decoder
from .messages import Pipeline, Task


@dataclass(frozen=True)
class Layout:
    """Where each field of a fixed-size record lies: (name, dtype, shape, offset, bytes)."""

    fields: tuple[tuple[str | None, np.dtype, tuple[int, ...], int, int], ...]
    size: int  # bytes a record

    @property
    def single(self) -> bool:
        return self.fields[0][0] is None


def layout(spec: ElementSpec) -> Layout | None:
    """The layout of `spec`'s records, or None when a record's size is not fixed (a
    variable or bytes field), is 0, or a field's dtype is not what collate would give."""
    out, at = [], 0
    for f in spec.fields:
        if f.dtype == BYTES or f.variable:
            return None
        dt, nbytes = f.layout
        if np.result_type(dt) != dt:
            return None  # (collate stacks into the native byte order)
        out.append((f.name, dt, tuple(f.shape), at, nbytes))
        at += nbytes
    return Layout(tuple(out), at) if at else None


def applies(pipeline: Pipeline) -> Layout | None:
    """The layout of `pipeline`'s records when its batches are made this way: its one
    record op is the typed decode of a fixed layout, batched without padding; else None."""
    ops = pipeline.record_ops
    if pipeline.records is not None or pipeline.batch is None or \
            pipeline.batch.rules is not None or len(ops) != 1 or type(ops[0]) is not MapOp \
            or type(ops[0].fn) is not Decode:
        return None
    return layout(ops[0].fn.spec)


def _matrix(lay: Layout, m: int, alloc: SlotAlloc) -> tuple[Any, np.ndarray] | None:
    """The batch of `m` records (allocated in the slot) and the byte matrix its records
    are decoded into (for named fields, this task's own: tasks may run on threads of one
    process); None when the slot has no room."""
    if lay.single:
        _, dt, shape, _, _ = lay.fields[0]
        batch = alloc((m, *shape), dt)
        return None if batch is None else (batch, batch.reshape(m, -1).view(np.uint8))
    arrays = {}
    for name, dt, shape, _, _ in lay.fields:
        a = alloc((m, *shape), dt)
        if a is None:
            return None
        arrays[name] = a
    return arrays, np.empty((m, lay.size), np.uint8)


def _cut(lay: Layout, batch: dict, matrix: np.ndarray) -> None:
    """Each named field's bytes copied out of the matrix into its array."""
    m = len(matrix)
    for name, _, _, at, nbytes in lay.fields:
        if nbytes:
            batch[name].reshape(m, -1).view(np.uint8)[...] = matrix[:, at : at + nbytes]


def typed_batches(task: Task, pipeline: Pipeline, decoder: Decoder, raws: Sequence | None,
                  paths: list[str], alloc: SlotAlloc, times: OpTimes
                  ) -> tuple[list, int] | None:
    """The batches of `task` (`raws`: its chunk bytes) of a pipeline this
    path `applies` to, and the nanoseconds spent decoding; None when the slot has no room
    for them all (nothing is decoded then) or a record does not fit (see the module doc).

    Every batch is allocated first, then the task's records are decoded in one call (each
    chunk read and decoded once, the decoder's counts the task's), then the batch ops run.
    """
    lay = applies(pipeline)
    assert lay is not None and pipeline.batch is not None, \
        "typed_batches of a pipeline it does not apply to"
    size, n = pipeline.batch.size, len(task.refs)
    made: list[tuple[Any, np.ndarray]] = []
    for lo in range(0, n, size):
        one = _matrix(lay, min(lo + size, n) - lo, alloc)
        if one is None:
            return None
        made.append(one)
    rows = [row for _, matrix in made for row in matrix]
    t0 = time.perf_counter_ns()
    try:
        got = decoder.into(task.refs, raws, rows, verify=pipeline.verify,
                           max_decoded=pipeline.max_decoded, paths=paths, stash=task.stash,
                           table=task.table)
    except Exception:  # made the general way instead: the same error, naming the record
        return None
    for row, record in zip(rows, got):
        if record is not None:
            if len(record) != lay.size:
                return None
            row[...] = np.frombuffer(record, np.uint8)
    spent = time.perf_counter_ns() - t0
    t1 = time.perf_counter()
    if not lay.single:
        for batch, matrix in made:
            _cut(lay, batch, matrix)
    times.items[0] += n
    times.seconds[0] += time.perf_counter() - t1
    return [apply_batch_ops(pipeline.batch_ops, batch, times=times, first=1)
            for batch, _ in made], spent
