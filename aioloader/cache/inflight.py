"""The memory tier's segment fetches under way: one task per segment, shared by every
reader that needs it.

Waiting is not owning: a reader cancelled while it waits leaves the fetch running for the
others; the first failure among those waited for is raised to each waiter. Closing cancels
them all, and waits for them, before the memory they write into goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from ..io.storage import StorageError


class InFlight:
    """Segment number -> the task fetching it."""

    def __init__(self) -> None:
        self._tasks: dict[int, asyncio.Task] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, s: int, fetch: Awaitable[None],
              landed: Callable[[asyncio.Task], None]) -> None:
        """Fetch segment `s` (`fetch`); `landed(task)` once it is done, whatever the end."""
        task = asyncio.ensure_future(fetch)
        self._tasks[s] = task
        task.add_done_callback(lambda t: self._done(s, t, landed))

    def _done(self, s: int, task: asyncio.Task, landed: Callable[[asyncio.Task], None]
              ) -> None:
        self._tasks.pop(s, None)
        landed(task)

    async def wait(self, segments: np.ndarray) -> None:
        """Until the fetches of these segments (those under way) are done; the first
        failure is raised."""
        tasks = [self._tasks[s] for s in segments.tolist() if s in self._tasks]
        if tasks:
            await asyncio.wait(tasks)
        for t in tasks:
            if t.cancelled():
                raise StorageError("a segment read was cancelled: the source is closing")
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    async def cancel(self) -> None:
        """Cancel every fetch under way (and those their ends start), and wait for them."""
        while self._tasks:
            tasks = list(self._tasks.items())
            for _, t in tasks:
                t.cancel()
            await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
            for s, _ in tasks:
                self._tasks.pop(s, None)
