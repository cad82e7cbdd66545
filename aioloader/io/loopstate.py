"""A `Storage`'s loop-bound resources, one set per event loop, and their closing.

Sessions and semaphores belong to the loop they were made on, so the same `Storage` used
from the caller's loop and from the sync API's background loop keeps one `LoopState` each.
Sessions left open (a source used through the sync API and never closed, a script that ends
on an exception) are closed on their loop when the `Storage` is collected or the interpreter
exits (`close_left_open`), so no "Unclosed client session" is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from .gate import ByteBudget, Gate

__all__ = ["ROUTES_KEPT", "LoopState", "close_backends", "close_left_open"]

ROUTES_KEPT = 1 << 16  # URLs whose backend is remembered (~100 bytes each): many files' worth


class LoopState:
    """What a `Storage` keeps per event loop: its request slots and byte budget, its
    backends (sessions), and which backend serves each URL."""

    def __init__(self, concurrency: int, max_bytes: int) -> None:
        self.slots = Gate(concurrency)  # resizable: `Storage.set_concurrency`
        self.budget = ByteBudget(max_bytes)
        self.backends: dict[str, Any] = {}
        self.routes: dict[str, tuple[Any, str]] = {}  # URL -> (its backend, its path there)


async def close_backends(state: LoopState) -> None:
    for backend in state.backends.values():
        with contextlib.suppress(Exception):
            await backend.aclose()
    state.backends.clear()
    state.routes.clear()


def close_left_open(loop: asyncio.AbstractEventLoop, state: LoopState, pid: int) -> None:
    """A `Storage` that was never closed is gone (or the interpreter is exiting): close its
    sessions on their loop, if that loop still runs here (a weakref.finalize callback; a
    forked child has the loop's object but not its thread)."""
    if (not state.backends or os.getpid() != pid or loop.is_closed()
            or not loop.is_running()):
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:  # collected on the loop's own thread: cannot wait here
        loop.create_task(close_backends(state))
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close_backends(state), loop).result(5)
