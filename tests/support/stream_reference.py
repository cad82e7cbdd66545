"""The stream-mode assembler as it was before workers sent columns and packing pieces (commit
4b701a7, verbatim but for imports and this docstring): what the new one must give, output for
output, state for state, error for error (tests/runtime/test_stream_assembly.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from aioloader.elements.collate import collate, collate_named
from aioloader.elements.packing import pack_first_fit
from aioloader.elements.transforms import BatchOp, PackOp, apply_batch_ops
from aioloader.runtime.stagestats import StageStats

# (window position, surviving elements), or None after the last window
NextWindow = Callable[[], Awaitable["tuple[int, list[Any]] | None"]]


class Assembler:
    """Delivers the stream-mode outputs of one run, starting at `start` (a loader state)."""

    def __init__(self, batching: BatchOp | PackOp | None, pack_batch: BatchOp | None,
                 batch_ops: tuple, start: dict[str, int], next_window: NextWindow,
                 stats: StageStats) -> None:
        self.batching = batching
        self.pack_batch = pack_batch
        self.batch_ops = batch_ops
        self.start = start
        self.next_window = next_window
        self.stats = stats
        self._buffer: deque = deque()  # (window position, j, element)
        self._rows: deque = deque()  # ((block position, block skip, rows done), row)
        self._first_window = True
        self._first_block = True
        self._done = False

    async def next(self) -> tuple[Any, dict[str, int]]:
        """The next output and the state after it; StopAsyncIteration at the end."""
        if isinstance(self.batching, PackOp):
            return await self._next_packed()
        if self.batching is None:
            item = await self._next_element()
            if item is None:
                raise StopAsyncIteration
            pos, j, element = item
            return element, {"position": pos, "skip": j + 1, "rows": 0}
        size, drop = self.batching.size, self.batching.drop_remainder
        items = []
        while len(items) < size:
            item = await self._next_element()
            if item is None:
                break
            items.append(item)
        if not items or (drop and len(items) < size):
            raise StopAsyncIteration
        t0 = self.stats.begin()
        batch = apply_batch_ops(self.batch_ops, collate_named(
            [e for _, _, e in items],
            lambda k: f"element {items[k][1]} of the window at output position {items[k][0]}"))
        self.stats.end(t0)
        pos, j, _ = items[-1]
        return batch, {"position": pos, "skip": j + 1, "rows": 0}

    # -- elements -----------------------------------------------------------------------

    async def _fill(self) -> bool:
        """Append the next window's surviving elements to the buffer; False at the end."""
        if self._done:
            return False
        window = await self.next_window()
        if window is None:
            self._done = True
            return False
        pos, elements = window
        skip = self.start["skip"] if self._first_window else 0
        self._first_window = False
        for j, element in enumerate(elements):
            if j >= skip:
                self._buffer.append((pos, j, element))
        return True

    async def _next_element(self) -> tuple[int, int, Any] | None:
        while not self._buffer:
            if not await self._fill():
                return None
        return self._buffer.popleft()

    # -- packing ------------------------------------------------------------------------

    async def _next_row(self) -> tuple[tuple[int, int, int], Any] | None:
        op: PackOp = self.batching  # type: ignore[assignment]
        while not self._rows:
            final = False
            while True:  # pack from the buffer; fetch windows until the block is complete
                items = list(self._buffer)
                block, used = pack_first_fit([e for _, _, e in items], op.length_struct,
                                             op.num_packing_bins, final=final)
                if block is not None:
                    break
                if final:
                    return None
                if not await self._fill():
                    final = True
            t0 = self.stats.begin()
            bpos, bskip, _ = items[0]
            for _ in range(used):
                self._buffer.popleft()
            skip_rows = self.start["rows"] if self._first_block else 0
            self._first_block = False
            key = next(iter(op.length_struct))
            filled = block[key + "_segment_ids"].reshape(op.num_packing_bins, -1).max(axis=1)
            for r_i, r in enumerate(np.flatnonzero(filled > 0).tolist()):
                if r_i >= skip_rows:
                    row = {name: arr[r] for name, arr in block.items()}
                    self._rows.append(((bpos, bskip, r_i + 1), row))
            self.stats.end(t0)
        return self._rows.popleft()

    async def _next_packed(self) -> tuple[Any, dict[str, int]]:
        want = self.pack_batch.size if self.pack_batch is not None else 1
        rows = []
        while len(rows) < want:
            item = await self._next_row()
            if item is None:
                break
            rows.append(item)
        if not rows or (self.pack_batch is not None and self.pack_batch.drop_remainder
                        and len(rows) < want):
            raise StopAsyncIteration
        (bpos, bskip, done), _ = rows[-1]
        state = {"position": bpos, "skip": bskip, "rows": done}
        if self.pack_batch is None:
            return apply_batch_ops(self.batch_ops, rows[0][1]), state
        return apply_batch_ops(self.batch_ops, collate([r for _, r in rows])), state
