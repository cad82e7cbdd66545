"""Typed records decoded straight into their batch's rows.

A pipeline whose one record op is the typed decode (`from_arrayrecord(decode=spec)`) of fixed
size numeric fields, batched without padding, needs no transform per record: each record is
the spec's bytes, and its batch is those bytes laid out as arrays. So a batch's records are
decoded into one (records, bytes a record) byte matrix: local one-record chunks are
decompressed right into their rows (`Decoder.into`), other records decoded, then copied in.
For one unnamed array that matrix is the batch itself, in the slot; named fields are cut out
of it with one strided copy a field. Decode, then collate, would copy each record twice more.

The output is the one the general path makes (`tests/workers/test_rows.py`): the arrays
collate allocates (native byte order), in the spec's field order. Whatever this path does not
take, a record not of the spec's size, or anything that raises gives None, and the caller
makes the task the general way, which decodes it again and names the error.
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


def _eligible(pipeline: Any) -> Layout | None:
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


def _fill(decoder: Decoder, task: Any, lo: int, hi: int, raws: Sequence | None,
          matrix: np.ndarray, pipeline: Any, paths: list[str]) -> bool:
    """Rows lo..hi-1 of the task decoded into `matrix`; False when a record is not a row's
    size (the matrix then holds anything)."""
    got = decoder.into(task.refs.take(lo, hi), None if raws is None else raws[lo:hi], matrix,
                       verify=pipeline.verify, max_decoded=pipeline.max_decoded,
                       paths=paths[lo:hi], stash=task.stash, table=task.table)
    size = matrix.shape[1]
    for k, record in enumerate(got):
        if record is not None:
            if len(record) != size:
                return False
            matrix[k] = np.frombuffer(record, np.uint8)
    return True


def typed_batches(task: Any, pipeline: Any, decoder: Decoder, raws: Sequence | None,
                  paths: list[str], alloc: SlotAlloc | None, times: OpTimes
                  ) -> tuple[list, int] | None:
    """The task's (a `messages.Task`; `raws` its chunk bytes) batches, made this way, and
    the nanoseconds spent decoding; None where this path does not apply or did not go
    through (see the module doc)."""
    lay = _eligible(pipeline)
    if lay is None or alloc is None:
        return None
    size, n, out, spent, cut = pipeline.batch.size, len(task.refs), [], 0, 0.0
    try:
        for lo in range(0, n, size):
            hi = min(lo + size, n)
            made = _matrix(lay, hi - lo, alloc)
            if made is None:
                return None
            batch, matrix = made
            t0 = time.perf_counter_ns()
            ok = _fill(decoder, task, lo, hi, raws, matrix, pipeline, paths)
            spent += time.perf_counter_ns() - t0
            if not ok:
                return None
            if not lay.single:
                t1 = time.perf_counter()
                _cut(lay, batch, matrix)
                cut += time.perf_counter() - t1
            out.append(apply_batch_ops(pipeline.batch_ops, batch, times=times, first=1))
    except Exception:  # made the general way instead: the same error, naming the record
        return None
    times.items[0] += n
    times.seconds[0] += cut
    return out, spent
