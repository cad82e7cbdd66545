"""filter + batch(): batches cut from consecutive windows, in order, each with its resume tag.

A window arrives as columns (`workers.pieces.Columns`, stacked by the worker) or as elements.
A batch inside one window's columns is a slice of them; one across windows of the same
schema a concatenation of slices; anything else (elements, or windows whose schemas differ)
is collated from the elements, as it always was, so the result and its errors never depend
on which form a window came in (`aioloader.elements.columns`). Runs on the assembler's thread.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..elements.collate import collate_named
from ..elements.columns import concat, rebuild, take
from ..elements.padding import Rule
from ..elements.transforms import BatchOp, MapOp, apply_batch_ops
from ..workers.pieces import Columns, Piece
from .stagestats import StageStats


class Raise:
    """An output slot that raises `exc` (once) when its turn comes."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Batcher:
    """Turns windows of survivors into batches of `op.size` (the last one short unless
    `drop_remainder`), with the state after each: `(window position, elements of that
    window delivered)`."""

    def __init__(self, op: BatchOp, batch_ops: tuple[MapOp, ...], stats: StageStats) -> None:
        self.size, self.drop = op.size, op.drop_remainder
        self.pad, self.masks = op.rules, op.masks
        self.batch_ops = batch_ops
        self.stats = stats
        self._windows: deque[list] = deque()  # [position, piece, next unused, count]
        self._buffered = 0

    def feed(self, pos: int, piece: Piece, skip: int) -> list[Any]:
        """Take one window (its first `skip` elements already delivered); the batches that
        are now complete, with their states."""
        count = piece.count if isinstance(piece, Columns) else len(piece)  # type: ignore[arg-type]  # never Packed
        if count > skip:
            self._windows.append([pos, piece, skip, count])
            self._buffered += count - skip
        out = []
        while self._buffered >= self.size:
            out.append(self._batch(self.size))
        return out

    def finish(self) -> list[Any]:
        """After the last window: the short batch left, if any and not dropped."""
        if self._buffered and not self.drop:
            return [self._batch(self._buffered)]
        return []

    def clear(self) -> None:
        """Drop the buffered windows (their arrays hold shared-memory slots)."""
        self._windows.clear()
        self._buffered = 0

    def _batch(self, n: int) -> Any:
        spans = []  # (position, piece, lo, hi)
        self._buffered -= n
        while n:
            w = self._windows[0]
            hi = min(w[3], w[2] + n)
            spans.append((w[0], w[1], w[2], hi))
            n -= hi - w[2]
            w[2] = hi
            if hi == w[3]:
                self._windows.popleft()
        pos, _, _, hi = spans[-1]
        state = {"position": pos, "skip": hi, "rows": 0}
        t0 = self.stats.begin()
        try:
            return apply_batch_ops(self.batch_ops, _collate(spans, self.pad, self.masks)), state
        except Exception as exc:  # the consumer gets it in this batch's turn
            return Raise(exc)
        finally:
            self.stats.end(t0)


def _collate(spans: list[tuple[int, Piece, int, int]], pad: Rule = None,
             masks: bool = True) -> Any:
    """What `collate` gives over the spans' elements (padded as `pad` says), from columns
    where it can."""
    first = spans[0][1]
    if pad is None and isinstance(first, Columns) and all(
            isinstance(p, Columns) and p.schema == first.schema for _, p, _, _ in spans[1:]):
        parts = [take(p.schema, p.cols, lo, hi) for _, p, lo, hi in spans]  # type: ignore[union-attr]
        return parts[0] if len(parts) == 1 else concat(first.schema, parts)
    elements: list = []
    names: list[tuple[int, int]] = []
    for pos, p, lo, hi in spans:
        elements.extend(rebuild(p.schema, p.cols, lo, hi) if isinstance(p, Columns)
                        else p[lo:hi])  # type: ignore[index]  # never Packed
        names.extend((pos, j) for j in range(lo, hi))
    return collate_named(elements, lambda k: f"element {names[k][1]} of the window at output "
                                             f"position {names[k][0]}", pad=pad, masks=masks)
