"""pack() (+ batch()): packed rows from consecutive windows, in order, each with its resume tag.

A packing block is a pure function of the elements from its first one on
(`packing.pack_first_fit`), and it may span windows, so it is decided here, over the whole
stream. A window arrives as lengths and concatenated data (`workers.pieces.Packed`, made by
the worker), and then the block is decided on the lengths alone (`packing.FirstFit`) and laid
out from the data (`packing.assemble`), with no element objects; or as elements, or beside a
window whose pieces have another dtype or trailing shape, and then `pack_first_fit` packs the
elements as it always did (same rows, same errors). Runs on the assembler's thread.

The tag of a row is that of the element starting its block, plus the rows of that block
delivered: re-packing from that element on resume gives the same rows. It also says where
the block closed (`until`: one past that window), which an elastic move needs to know.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..elements.collate import collate
from ..elements.packing import FirstFit, assemble, check_pack_config, pack_first_fit
from ..elements.transforms import BatchOp, MapOp, PackOp, apply_batch_ops
from ..workers.pieces import Packed, Piece
from .batcher import Raise
from .stagestats import StageStats


class Stuck(Raise):
    """An output slot that raises `exc` at every turn: packing cannot go past it."""


class _Window:
    """One window from the block's start on: `lo` is its first element not yet packed."""

    def __init__(self, pos: int, piece: Piece, lo: int, names: list[str]) -> None:
        self.pos, self.piece, self.lo, self.names = pos, piece, lo, names
        if isinstance(piece, Packed):
            self.count = piece.count
            self.lengths = piece.lengths.tolist()
            ends = np.cumsum(piece.lengths, axis=0)
            self.starts = np.concatenate([np.zeros((1, ends.shape[1]), ends.dtype), ends])
        else:
            self.count = len(piece)  # type: ignore[arg-type]  # never Columns

    def element(self, j: int) -> Any:
        if not isinstance(self.piece, Packed):
            return self.piece[j]  # type: ignore[index]  # never Columns
        return {name: data[self.starts[j, f] : self.starts[j + 1, f]]
                for f, (name, data) in enumerate(zip(self.names, self.piece.datas))}


class Packer:
    """Turns windows of survivors into packed rows (or batches of them)."""

    def __init__(self, op: PackOp, pack_batch: BatchOp | None, batch_ops: tuple[MapOp, ...],
                 skip_rows: int, stats: StageStats, window: int = 0) -> None:
        self.op = op
        self.names = list(op.length_struct)
        self.pack_batch, self.batch_ops = pack_batch, batch_ops
        self.stats = stats
        self._skip_rows = skip_rows  # of the first block (resuming inside it)
        self._windows: list[_Window] = []  # from the block's first element on
        self._rows: deque = deque()  # ((block position, block skip, rows done), block, row)
        self._fit: FirstFit | None = None  # the block being decided on lengths
        self._scan: tuple[int, int | None] = (0, None)  # (window, element) it has reached;
        # None: the window's first
        self._failed: BaseException | None = None
        self._window = window  # output positions a window spans (0: unknown)
        self._until = 0  # one past the window where the block being closed ends

    def feed(self, pos: int, piece: Piece, skip: int) -> list[Any]:
        if self._failed is None:
            w = _Window(pos, piece, skip, self.names)
            if w.count > skip:
                self._windows.append(w)
            self._pack(final=False)
        return self._outputs(final=False)

    def finish(self) -> list[Any]:
        if self._failed is None:
            self._pack(final=True)
        return self._outputs(final=True)

    def restart(self, skip_rows: int) -> list[Any]:
        """Close every open block here (a leftover lane begins), and skip the first
        `skip_rows` rows of the next block (its old process delivered them)."""
        if self._failed is None:
            self._pack(final=True)
        self._skip_rows = skip_rows
        return self._outputs(final=False)

    def clear(self) -> None:
        """Drop the buffered windows and rows (their arrays hold shared-memory slots)."""
        self._windows.clear()
        self._rows.clear()
        self._fit = None

    # -- blocks ---------------------------------------------------------------------------

    def _pack(self, final: bool) -> None:
        """Close every block the windows decide (all of them, if `final`)."""
        try:
            targets = check_pack_config(self.op.length_struct, self.op.num_packing_bins).tolist()
            while self._windows:
                closed = self._fast(targets, final)
                if closed is None:
                    closed = self._slow(final)
                if not closed:
                    return
        except Exception as exc:  # as pack_first_fit raised it: at every later call
            self._failed = exc

    def _fast(self, targets: list[int], final: bool) -> bool | None:
        """Decide the block on lengths: True if it closed, False if it needs more windows
        (or, if `final`, ended the stream), None if it needs the elements (`_slow`)."""
        first = self._windows[0].piece
        if not isinstance(first, Packed):
            return None
        if self._fit is None:
            self._fit = FirstFit(targets, self.op.num_packing_bins)
            self._scan = (0, None)
        fit = self._fit
        wi, start = self._scan
        while wi < len(self._windows):
            w = self._windows[wi]
            if not isinstance(w.piece, Packed) or w.piece.signature != first.signature:
                self._scan = (wi, start)
                return None
            i = fit.scan(w.lengths, w.lo if start is None else start, w.count)
            if i < w.count:  # element i fits nowhere: it starts the next block
                self._until = w.pos
                self._close_fast(targets, wi, i)
                return True
            wi, start = wi + 1, None
        self._scan = (wi, None)
        if final:
            if fit.bins:
                self._until = self._windows[-1].pos
                self._close_fast(targets, len(self._windows), 0)
            else:
                self._windows.clear()
                self._fit = None
        return False

    def _close_fast(self, targets: list[int], wi: int, i: int) -> None:
        """The block is every element from the first window's `lo` up to element `i` of
        window `wi` (exclusive)."""
        t0 = self.stats.begin()
        first = self._windows[0]
        spans = [(w, w.lo, i if k == wi else w.count) for k, w in
                 enumerate(self._windows[: wi + 1])]
        datas = []
        for f in range(len(self.names)):
            parts = [w.piece.datas[f][w.starts[lo, f] : w.starts[hi, f]]  # type: ignore[union-attr]
                     for w, lo, hi in spans if hi > lo]
            datas.append(np.concatenate(parts) if len(parts) > 1 else parts[0])
        block = assemble(self.names, targets, self._fit, datas,  # type: ignore[arg-type]
                         first.piece.signature)  # type: ignore[union-attr]
        self._add_rows(block, first.pos, first.lo)
        self._consume(wi, i)
        self.stats.end(t0)

    def _slow(self, final: bool) -> bool:
        """`pack_first_fit` over the elements from the block's start: True if a block
        closed, False if it needs more windows (or the stream ended)."""
        items = [(w.pos, j, w) for w in self._windows for j in range(w.lo, w.count)]
        block, used = pack_first_fit([w.element(j) for _, j, w in items],
                                     self.op.length_struct, self.op.num_packing_bins,
                                     final=final)
        if block is None:
            if final:
                self._windows.clear()
            return False
        t0 = self.stats.begin()
        self._until = items[min(used, len(items) - 1)][0]
        self._add_rows(block, items[0][0], items[0][1])
        if used == len(items):
            self._consume(len(self._windows), 0)
        else:
            _, j, w = items[used]
            self._consume(self._windows.index(w), j)
        self.stats.end(t0)
        return True

    def _consume(self, wi: int, i: int) -> None:
        """The next block starts at element `i` of window `wi`."""
        del self._windows[:wi]
        if self._windows:
            self._windows[0].lo = i
        self._fit = None

    def _add_rows(self, block: dict[str, np.ndarray], bpos: int, bskip: int) -> None:
        skip_rows, self._skip_rows = self._skip_rows, 0
        key = self.names[0]
        filled = block[key + "_segment_ids"].reshape(self.op.num_packing_bins, -1).max(axis=1)
        until = self._until + self._window if self._window else 0
        for r_i, r in enumerate(np.flatnonzero(filled > 0).tolist()):
            if r_i >= skip_rows:
                self._rows.append(((bpos, bskip, r_i + 1, until), block, r))

    # -- outputs --------------------------------------------------------------------------

    def _outputs(self, final: bool) -> list[Any]:
        out: list[Any] = []
        want = self.pack_batch.size if self.pack_batch is not None else 1
        while len(self._rows) >= want:
            out.append(self._output([self._rows.popleft() for _ in range(want)]))
        if self._failed is not None:
            self._rows.clear()  # rows of an unfinished batch: lost with the error, as before
            out.append(Stuck(self._failed))
        elif final and self._rows and not self.pack_batch.drop_remainder:  # type: ignore[union-attr]
            out.append(self._output(list(self._rows)))
            self._rows.clear()
        return out

    def _output(self, rows: list) -> Any:
        (bpos, bskip, done, until), _, _ = rows[-1]
        state = {"position": bpos, "skip": bskip, "rows": done, "until": until}
        try:
            if self.pack_batch is None:
                _, block, r = rows[0]
                return apply_batch_ops(self.batch_ops,
                                       {name: arr[r] for name, arr in block.items()}), state
            return apply_batch_ops(self.batch_ops, _stack_rows(rows)), state
        except Exception as exc:
            return Raise(exc)


def _stack_rows(rows: list) -> dict[str, np.ndarray]:
    """What `collate` gives over the rows (each `{name: block[name][r]}`): the rows of one
    block taken in one indexing per array, blocks joined."""
    parts: list[tuple[dict, list[int]]] = []
    for _, block, r in rows:
        if parts and parts[-1][0] is block:
            parts[-1][1].append(r)
        else:
            parts.append((block, [r]))
    if len(parts) == 1:
        block, idx = parts[0]
        return {name: arr[idx] for name, arr in block.items()}
    first = parts[0][0]
    if any(block[name].shape != arr.shape or block[name].dtype != arr.dtype
           for block, _ in parts[1:] for name, arr in first.items()):
        # blocks laid out differently (an all-empty feature takes its first element's
        # dtype and shape): collate says what to do
        return collate([{name: arr[r] for name, arr in block.items()} for _, block, r in rows])
    return {name: np.concatenate([block[name][idx] for block, idx in parts])
            for name in first}
