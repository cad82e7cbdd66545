"""A big batch made piece by piece, straight into its slot of the arena.

Decoding a whole batch before collating it holds every record, and what the record ops made
of it, at once: 268 MB per worker for 256 records of 1 MiB (kept by glibc after the task),
on top of the batch in its slot. Here a batch's records are decoded, transformed and stacked
into the batch's rows a piece of about `PIECE_BYTES` at a time, so a worker holds one piece.
The batch's arrays are allocated in the slot, for all its rows, when the first piece is
collated (its structure, shapes and dtypes are taken as the batch's); each later piece is
collated straight into its rows (`_Rows`), and lists of strings are joined.

The output is the same as collating the whole batch: when a piece does not stack as the
first did (other keys, shapes or dtypes, object arrays, no room in the slot) or anything
raises, `make_batch` gives None and the caller makes the task whole, as before, which also
raises the same error, naming the same record, as it would have (transforms are pure: a
record transformed twice gives the same). A pipeline whose pieces did not stack once is made
whole from then on in this process (`_whole`), so the work of a piece is not lost per task.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..elements.collate import collate
from ..elements.transforms import MapOp, OpTimes, RandomMapOp, apply_batch_ops, apply_record_ops
from .arena import SlotAlloc
from .decode import Decoder, chunk_keys
from .messages import Pipeline, Task

PIECE_BYTES = 8 << 20  # records' stored bytes per piece (smaller pieces cost rate and CPU)
MIN_TASK_BYTES = 16 << 20  # smaller tasks are made whole (a few pieces would be the whole)

_whole: set[int] = set()  # ids of pipelines whose pieces did not stack (see module doc)
# id of a pipeline -> the largest slot room its batch did not fit: with no more room than
# that (workers=0, whose slots never grow), a task is made whole at once, without a piece
# made in vain first
_too_small: dict[int, int] = {}


class NoRoom(Exception):
    """The slot cannot hold the whole batch (the pool grows it and runs the task again)."""


def worth_it(pipeline: Any, sizes: np.ndarray, group_size_one: bool, room: int) -> bool:
    """Whether to make a task's batches in pieces: batch mode, records of one-record chunks
    (each piece decodes its own), no padding, record ops that keep every record (map,
    random_map),
    `sizes` (the records' stored bytes) adding up to `MIN_TASK_BYTES` or more, and `room`
    (bytes free in the slot) at least that, and more than a batch of this pipeline found
    too small. (A piece made in vain is not free: at workers=0, whose slots never grow,
    one such piece's records left glibc's heap laid out so that every later batch was
    faulted in afresh, 10x the page faults.)"""
    stored = int(sizes.sum())
    return (pipeline.batch is not None and pipeline.batch.rules is None  # (padding: the
            # longest is known only once every piece is made)
            and group_size_one and pipeline.records is None
            and id(pipeline) not in _whole and room > _too_small.get(id(pipeline), -1)
            and all(type(op) in (MapOp, RandomMapOp) for op in pipeline.record_ops)
            and MIN_TASK_BYTES <= stored <= room)


def give_up(pipeline: Any) -> None:
    """Make `pipeline`'s tasks whole from now on (its pieces did not stack)."""
    _whole.add(id(pipeline))


def no_room(pipeline: Any, room: int) -> None:
    """A batch of `pipeline` did not fit `room` bytes: make its tasks whole until slots have
    more room (the pool grows them after the task, from its output)."""
    _too_small[id(pipeline)] = max(room, _too_small.get(id(pipeline), -1))


def cuts(sizes: np.ndarray, lo: int, hi: int, target: int = PIECE_BYTES) -> list[tuple[int, int]]:
    """Rows `lo..hi-1` cut into consecutive pieces of about `target` stored bytes (at least
    one row each)."""
    out: list[tuple[int, int]] = []
    ends = np.cumsum(sizes[lo:hi])
    start, base = lo, 0
    while start < hi:
        k = int(np.searchsorted(ends, base + target, side="left")) + 1 + lo
        k = max(start + 1, min(k, hi))
        out.append((start, k))
        base = int(ends[k - lo - 1])
        start = k
    return out


class _Rows:
    """The allocator collate gets for one piece: for the first piece it allocates each array
    for all `n` rows in the slot and hands out the piece's rows; for later pieces it hands
    out the rows of the array allocated in the same order, if shape and dtype agree."""

    def __init__(self, alloc: SlotAlloc, n: int) -> None:
        self.alloc, self.n = alloc, n
        self.full: list[np.ndarray] = []
        self.given: list[np.ndarray] = []  # this piece's, in order
        self.lo, self.first, self.ok = 0, True, True

    def piece(self, lo: int, first: bool) -> None:
        self.lo, self.first, self.given = lo, first, []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        dtype, k = np.dtype(dtype), len(self.given)
        if self.first:
            a = self.alloc((self.n, *shape[1:]), dtype)
            if a is None:
                raise NoRoom
            self.full.append(a)
        elif k >= len(self.full) or self.full[k].shape[1:] != tuple(shape[1:]) \
                or self.full[k].dtype != dtype:
            self.ok = False
            return None
        view = self.full[k][self.lo : self.lo + shape[0]]
        self.given.append(view)
        return view


def _skeleton(tree: Any, arrays: list, lists: list) -> Any:
    """`tree`'s shape as nested tuples (dict keys in order), its arrays and lists of strings
    collected in order; None if it holds anything else (an object array, a number)."""
    if isinstance(tree, dict):
        parts = [(k, _skeleton(v, arrays, lists)) for k, v in tree.items()]
        return None if any(p is None for _, p in parts) else ("d", tuple(parts))
    if isinstance(tree, tuple):
        parts = [_skeleton(v, arrays, lists) for v in tree]
        return None if any(p is None for p in parts) else ("t", tuple(parts))
    if isinstance(tree, list) and all(isinstance(v, (str, bytes)) for v in tree):
        lists.append(tree)
        return "l"
    if isinstance(tree, np.ndarray) and not tree.dtype.hasobject:
        arrays.append(tree)
        return "a"
    return None


def _rebuild(tree: Any, arrays: Any, lists: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _rebuild(v, arrays, lists) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_rebuild(v, arrays, lists) for v in tree)
    if isinstance(tree, list):
        return next(lists)
    return next(arrays)


def make_batch(lo: int, hi: int, pieces: Sequence[tuple[int, int]],
               elements_of: Callable[[int, int], list], alloc: SlotAlloc) -> Any | None:
    """The batch of rows `lo..hi-1`, collated piece by piece into the slot (`alloc`);
    `elements_of(a, b)` gives rows a..b-1's elements (decoded and transformed). None if the
    pieces do not stack as one batch would (see the module doc); `NoRoom` if the slot is too
    small for the batch; what collate raises for a piece it cannot stack."""
    rows = _Rows(alloc, hi - lo)
    shape: Any = None
    first_tree: Any = None
    joined: list[list] = []
    for a, b in pieces:
        rows.piece(a - lo, first=shape is None)
        tree = collate(elements_of(a, b), alloc=rows)
        arrays: list[np.ndarray] = []
        lists: list[list] = []
        got = _skeleton(tree, arrays, lists)
        if (not rows.ok or got is None or (shape is not None and got != shape)
                or len(arrays) != len(rows.given)
                or any(x is not y for x, y in zip(arrays, rows.given))):
            return None
        if shape is None:
            shape, first_tree, joined = got, tree, [list(v) for v in lists]
        else:
            for acc, more in zip(joined, lists):
                acc += more
    if shape is None or len(rows.full) != len(rows.given):
        return None
    return _rebuild(first_tree, iter(rows.full), iter(joined))


def in_pieces(task: Task, pipeline: Pipeline, decoder: Decoder, raws: Sequence | None,
              paths: list[str], alloc: SlotAlloc | None, times: OpTimes
              ) -> tuple[list, int] | None:
    """A big task's batches (`raws`: the task's chunk bytes) made a piece
    at a time, straight into the slot, and the nanoseconds spent decoding; None where that
    does not apply or the pieces did not stack (the task is then made whole)."""
    refs = task.refs
    sizes = refs.end - refs.start
    if alloc is None or pipeline.batch is None or not worth_it(
            pipeline, sizes, chunk_keys(refs) is None, alloc.end - alloc.pos):
        return None
    indices, epochs = task.indices.tolist(), task.epochs.tolist()
    spent = 0

    def elements_of(a: int, b: int) -> list:
        nonlocal spent
        t0 = time.perf_counter_ns()
        records = decoder.records(refs.take(a, b), None if raws is None else raws[a:b],
                                  verify=pipeline.verify, max_decoded=pipeline.max_decoded,
                                  paths=paths[a:b], stash=task.stash, table=task.table)
        spent += time.perf_counter_ns() - t0
        return apply_record_ops(pipeline.record_ops, records, indices[a:b], epochs[a:b],
                                paths[a:b], times=times)

    size, n, out = pipeline.batch.size, len(refs), []
    try:
        for lo in range(0, n, size):
            hi = min(lo + size, n)
            batch = make_batch(lo, hi, cuts(sizes, lo, hi), elements_of, alloc)
            if batch is None:
                give_up(pipeline)
                return None
            out.append(apply_batch_ops(pipeline.batch_ops, batch, times=times,
                                       first=len(pipeline.record_ops)))
    except NoRoom:  # (made whole, it asks for room)
        no_room(pipeline, alloc.end - alloc.base)
        return None
    except Exception:  # made whole instead: the same error, naming the same record
        return None
    return out, spent
