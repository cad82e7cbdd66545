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
import os
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from ..io.sync import acquire, close_sync, release


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
        self._ref: list[Callable[[], Any]] = [weakref.ref(loader)]
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
        if gen is not None and not gen.ag_running:  # type: ignore[attr-defined]
            # (running: it is what closes the loader)
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


class Binding:
    """The event loop and process a loader runs on, and how sync code reaches them.

    A loader starts on the loop that first awaits it (or, from sync code, on the shared
    background loop: `background()`), and is refused on any other loop and in a forked
    child. `close()` stops it from any thread, on its own loop.
    """

    def __init__(self, user: object) -> None:
        self.user = user  # what keeps the background loop up while it is used
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pid: int | None = None  # the process that started it
        self.used_sync = False  # driven from the background loop of the sync API

    def check_process(self) -> None:
        if self.pid is not None and self.pid != os.getpid():
            raise forked_error(self.pid)

    def bind(self) -> asyncio.AbstractEventLoop:
        """The running loop, which must be this loader's (the first one seen is)."""
        self.check_process()
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop, self.pid = loop, os.getpid()
        elif self.loop is not loop:
            raise RuntimeError("a Loader runs on one event loop; this one started on another")
        return loop

    def background(self) -> asyncio.AbstractEventLoop:
        """The shared background loop, kept up until `release()`."""
        self.used_sync = True
        return acquire(self.user)

    def release(self) -> None:
        if self.used_sync:  # the background loop stays up until the last user is done
            self.used_sync = False
            release(self.user)

    def close(self, aclose: Callable[[], Coroutine[Any, Any, None]],
              unreachable: Callable[[], None]) -> None:
        """Run `aclose()` on the loader's loop from sync code, from any thread; when that
        loop cannot be reached (never started, gone at interpreter exit, or this is a forked
        child whose loop and workers are the parent's) call `unreachable()` to free what is
        this process's. On the background loop's own thread the closing is started there,
        not waited for (`sync.close_sync`)."""
        loop = self.loop
        if self.pid not in (None, os.getpid()) or loop is None or loop.is_closed():
            unreachable()
            return
        if self.used_sync:
            close_sync(aclose())
        elif loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                raise RuntimeError("close() cannot wait on the loop it runs on: use "
                                   "`await aclose()`")
            asyncio.run_coroutine_threadsafe(aclose(), loop).result()
        else:
            loop.run_until_complete(aclose())
