"""bucket_by_length(): padded batches from consecutive windows, in order, each with its
resume tag.

A bucket fills from elements of any number of windows, so the buckets are kept here, over
the whole stream (`elements.bucketing.Buckets` decides), on the assembler's thread: each
element's length (`length_fn`) is taken as it arrives, and a full bucket is collated, padded
(`collate`), when it fills. Windows arrive as elements (`workers.pieces` sends them so): a
pending element holds no shared-memory slot, however long its bucket takes to fill.

The tag after a batch is `Buckets`' place: the window position and skip of the earliest
element still pending, and per bucket how many of its elements from there on were emitted
(`buckets`); resuming there replays the stream from that element and gives the same batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..elements.bucketing import BucketOp, Buckets, bucket_of
from ..elements.collate import collate_named
from ..elements.columns import rebuild
from ..elements.transforms import MapOp, apply_batch_ops
from ..errors import StateError, TransformError
from ..workers.pieces import Columns, Piece
from .batcher import Raise
from .packer import Stuck
from .stagestats import StageStats


class Bucketer:
    """Turns windows of survivors into the buckets' padded batches, with the state after
    each: `(position, skip)` of the replay's first element, and `buckets`."""

    def __init__(self, op: BucketOp, batch_ops: tuple[MapOp, ...], skips: tuple[int, ...],
                 stats: StageStats) -> None:
        self.op, self.batch_ops, self.stats = op, batch_ops, stats
        self.buckets = Buckets(op.batch_sizes, op.drop_remainder, skips)
        self._after: tuple[int, int] = (0, 0)  # the tag just after the last element
        self._failed: BaseException | None = None

    def feed(self, pos: int, piece: Piece, skip: int) -> list[Any]:
        """Take one window (its first `skip` elements already delivered); the batches that
        filled, with their states."""
        if self._failed is not None:
            return []
        elements = (rebuild(piece.schema, piece.cols, 0, piece.count)
                    if isinstance(piece, Columns) else piece)
        out: list[Any] = []
        length_fn, bounds = self.op.length_fn, self.op.boundaries
        j = skip
        try:
            for j in range(skip, len(elements)):  # type: ignore[arg-type]  # never Packed
                element = elements[j]  # type: ignore[index]
                bucket = bucket_of(_length(length_fn(element), pos, j), bounds)
                for b, items, place in self.buckets.add((pos, j, element), (pos, j), bucket,
                                                        (pos, j + 1)):
                    out.append(self._batch(b, items, place))
        except Exception as exc:
            self._failed = exc if isinstance(exc, StateError) else _named(exc, self.op, pos, j)
            self.buckets.clear()
            out.append(Stuck(self._failed))
            return out
        self._after = (pos, max(skip, len(elements)))  # type: ignore[arg-type]
        return out

    def finish(self) -> list[Any]:
        """After the last window: the partial buckets in bucket order (unless dropped)."""
        if self._failed is not None:
            return []
        return [self._batch(b, items, place) for b, items, place in
                self.buckets.finish(self._after)]

    def restart(self, skip_rows: int) -> list[Any]:  # (elastic moves are refused: see state)
        raise AssertionError("bucket_by_length() states do not move between process counts")

    def clear(self) -> None:
        self.buckets.clear()

    def _batch(self, bucket: int, items: list, place: Any) -> Any:
        (pos, skip), skips = place
        state = {"position": pos, "skip": skip, "rows": 0, "buckets": list(skips)}
        t0 = self.stats.begin()
        try:
            batch = collate_named(
                [e for _, _, e in items],
                lambda k: f"element {items[k][1]} of the window at output position "
                          f"{items[k][0]} (bucket {bucket})",
                pad=self.op.rules, masks=self.op.masks, verb="bucket_by_length")
            return apply_batch_ops(self.batch_ops, batch), state
        except Exception as exc:  # the consumer gets it in this batch's turn
            return Raise(exc)
        finally:
            self.stats.end(t0)


def _length(value: Any, pos: int, j: int) -> int:
    """`length_fn`'s result as an int >= 0, or a TypeError/ValueError saying what it was."""
    if type(value) is int and value >= 0:
        return value
    whole = isinstance(value, (int, np.integer)) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu")
    if isinstance(value, (bool, np.bool_)) or not whole:
        raise TypeError(f"length_fn must return an int, got {value!r:.80} "
                            f"({type(value).__name__})")
    if int(value) < 0:
        raise ValueError(f"length_fn must return a length >= 0, got {int(value)}")
    return int(value)


def _named(exc: Exception, op: BucketOp, pos: int, j: int) -> Exception:
    """`exc` (from length_fn) with the element it was raised on."""
    return TransformError(f"{op.describe()}: length_fn raised {type(exc).__name__}: {exc} on "
                          f"element {j} of the window at output position {pos}")
