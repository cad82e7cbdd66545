"""Stream mode: turn windows of surviving elements into elements, batches or packed rows.

With a filter or pack in the pipeline, tasks cover fixed windows of output positions and the
workers return whatever survived, stacked into columns or cut into packing pieces where the
elements allow (`workers.pieces`). Batch boundaries and packing blocks cross windows, so they
are decided here, over the whole stream, in order: by `Batcher` (filter + batch) and `Packer`
(pack), on one thread the assembler owns, never on the event loop's. A task's outputs are
made in one go, so the loop pays one hand-off per task, not per batch. Every item carries
its resume tag, so the state after any batch is exact:

- elements and batches: `(window position, elements of that window already delivered)`;
- packed rows: the tag of the element that starts the packing block, plus the rows of that
  block already delivered. A block is a pure function of the elements from its first one on
  (`packing.pack_first_fit`), so re-packing from there on resume gives the same rows.

After an elastic move (`aioloader.index.lanes`) the stream begins with old processes' leftovers:
a window begins where each begins (`cuts`), with the elements (and packed rows of its first
block) its old process had delivered skipped, and packing restarts there (`restarts`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ..elements.bucketing import BucketOp
from ..elements.transforms import BatchOp, PackOp
from ..workers.inline import InlineExecutor
from ..workers.pieces import read
from .batcher import Batcher, Raise
from .bucketer import Bucketer
from .packer import Packer, Stuck
from .stagestats import StageStats

# A task's output positions [lo, hi), what its worker sent and where in the task each
# survivor was (`workers.pieces`): `(lo, hi, payload, survivors)`, or None after the last
NextWindow = Callable[[], Awaitable["tuple[int, int, Any, Any] | None"]]


class Assembler:
    """Delivers the stream-mode outputs of one run, starting at `start` (a loader state),
    over windows of `window` output positions (0: each task is one window)."""

    def __init__(self, batching: BatchOp | PackOp | BucketOp | None,
                 pack_batch: BatchOp | None,
                 batch_ops: tuple, start: dict[str, Any], next_window: NextWindow,
                 stats: StageStats, window: int = 0,
                 restarts: list[tuple[int, int, int]] | None = None,
                 cuts: list[int] | None = None) -> None:
        self.start = start
        self.window = window
        # where a leftover lane begins: (skip, rows) delivered by its old process
        self.restarts = {p: (s, r) for p, s, r in restarts or () if p >= start["position"]}
        self.cuts = list(cuts or ())
        first = self.restarts.get(start["position"])
        if first is not None:  # the state's own place is at or past the old process's
            if start["skip"] > first[0]:
                del self.restarts[start["position"]]
            else:
                rows = start["rows"] if start["skip"] == first[0] else 0
                self.restarts[start["position"]] = (first[0], max(first[1], rows))
        self.next_window = next_window
        self._stage: Batcher | Packer | Bucketer | None = None
        if isinstance(batching, PackOp):
            self._stage = Packer(batching, pack_batch, batch_ops, start["rows"], stats,
                                 window)
        elif isinstance(batching, BucketOp):
            self._stage = Bucketer(batching, batch_ops, tuple(start.get("buckets", ())), stats)
        elif batching is not None:
            self._stage = Batcher(batching, batch_ops, stats)
        self._ready: deque = deque()  # (output, state), or Raise
        self._job: asyncio.Future | None = None  # the stage's work on the last window
        self._first_window = True
        self._done = False
        self._closed = False
        self._executor: InlineExecutor | None = None
        self._windows: deque = deque()  # elements mode: (pos, elements, next) to deliver

    async def next(self) -> tuple[Any, dict[str, Any]]:
        """The next output and the state after it; StopAsyncIteration at the end."""
        if self._closed:
            raise StopAsyncIteration
        if self._stage is None:
            return await self._next_element()
        while not self._ready:
            if self._job is not None:
                await self._settle()
            elif self._done:
                raise StopAsyncIteration
            else:
                window = await self.next_window()
                if window is None:
                    self._done = True
                    self._submit(self._stage.finish)
                else:
                    self._submit(_feed, self._stage, window, self.window, self._skip(),
                                 self.cuts, self.restarts)
        item = self._ready[0]
        if isinstance(item, Stuck):
            raise item.exc
        self._ready.popleft()
        if isinstance(item, Raise):
            raise item.exc
        return item

    def close(self) -> None:
        """Let the assembler's thread go (it ends after the work it is doing, if any) and
        drop what is buffered (windows hold shared-memory slots)."""
        self._ready.clear()
        self._windows.clear()
        self._closed = True
        if self._stage is not None:
            self._stage.clear()
        if self._executor is not None:
            self._executor.close(0)

    def _skip(self) -> int:
        """Elements of the first window delivered before the run started (0 after it)."""
        skip = self.start["skip"] if self._first_window else 0
        self._first_window = False
        return skip

    def _submit(self, fn: Callable[..., list], *args: Any) -> None:
        if self._executor is None:
            self._executor = InlineExecutor("aioloader-assemble")
            weakref.finalize(self, self._executor.close, 0)
        self._job = asyncio.wrap_future(self._executor.submit(fn, *args, label="assembly"))

    async def _settle(self) -> None:
        """Wait for the stage's work (shielded: a cancelled consumer finds it done on its
        next call) and queue its outputs."""
        job = self._job
        assert job is not None
        try:
            outputs = await asyncio.shield(job)
        except asyncio.CancelledError:
            # Cancelled as the work finished: its outputs are kept, not dropped with it.
            if job.done() and not job.cancelled() and job.exception() is None:
                self._job = None
                self._ready.extend(job.result())
            raise
        except BaseException:
            self._job = None
            raise
        self._job = None
        self._ready.extend(outputs)

    async def _next_element(self) -> tuple[Any, dict[str, Any]]:
        while not self._windows or self._windows[0][2] >= len(self._windows[0][1]):
            if self._windows:
                self._windows.popleft()
                continue
            if self._done:
                raise StopAsyncIteration
            task = await self.next_window()
            if task is None:
                self._done = True
                raise StopAsyncIteration
            skip = self._skip()
            for k, (pos, elements) in enumerate(read(*task, self.window, self.cuts)):
                again = self.restarts.get(pos)
                first = skip if k == 0 else 0
                self._windows.append([pos, elements, max(first, again[0]) if again else first])
        window = self._windows[0]
        pos, elements, j = window
        window[2] = j + 1
        return elements[j], {"position": pos, "skip": j + 1, "rows": 0}


def _feed(stage: Batcher | Packer | Bucketer, task: tuple, window: int, skip: int,
          cuts: list[int], restarts: dict[int, tuple[int, int]]) -> list:
    """On the assembler's thread: a task's windows into the stage, in order (`skip`: of
    the first window's elements, those delivered before the run started; `restarts`:
    where a leftover lane begins, see the module docstring)."""
    out: list = []
    for k, (at, piece) in enumerate(read(*task, window, cuts)):  # type: ignore[call-arg]
        first = skip if k == 0 else 0
        again = restarts.get(at)
        if again is not None:
            if isinstance(stage, Packer):
                out += stage.restart(again[1])
            first = max(first, again[0])
        out += stage.feed(at, piece, first)
    return out
