"""What ties a running loader to the event loop and the process that started it.

A loader iterated with `async for` but never closed (left by `break` or Ctrl-C without
`async with`) would keep its workers, threads and shared memory until the garbage collector
found it. `LoopGuard` is an async generator started on the loader's loop and left suspended:
when the loop ends, `loop.shutdown_asyncgens()` (which `asyncio.run`, uvloop and anyio call
before closing the loop) closes it, and closing it closes the loader, on that loop, before
`asyncio.run` returns. It holds the loader weakly, so it never keeps one alive.

A forked child inherits the loader's objects but not its loop thread or its workers: using
it there raises `forked_error` at once (a new loader in the child works).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator
from typing import Any


async def _guard(ref: list) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        loader = ref[0]()
        if loader is not None:
            await loader.aclose()


def _gone() -> None:
    return None


class LoopGuard:
    """Closes `loader` (`await loader.aclose()`) when the running loop shuts down."""

    def __init__(self, loader: Any) -> None:
        self._ref = [weakref.ref(loader)]
        self._gen: AsyncGenerator[None, None] | None = _guard(self._ref)

    async def arm(self) -> None:
        """Start the guard on the running loop (registers it with the loop's hooks)."""
        if self._gen is not None:
            await self._gen.__anext__()

    def disarm(self) -> None:
        """The loader is closing by itself: end the guard now, without touching the loop
        (its `finally` has nothing left to await, so one step closes it)."""
        self._ref[0] = _gone
        gen, self._gen = self._gen, None
        if gen is not None and not gen.ag_running:  # running: it is what closes the loader
            closing = gen.aclose()
            with contextlib.suppress(StopIteration):
                closing.send(None)


def forked_error(pid: int) -> RuntimeError:
    return RuntimeError(
        f"this loader was started in process {pid}, and this process is a fork of it: its "
        "event loop, worker processes and shared memory are the parent's. Create a new "
        "loader in the child (e.g. from the same dataset with state=loader.get_state())")


def closed_while_waiting(closed: bool) -> bool:
    """Whether a CancelledError a consumer got is the loader being closed (by another task
    or thread), rather than the consumer's own task being cancelled."""
    if not closed:
        return False
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return task is None or cancelling is None or cancelling() == 0
