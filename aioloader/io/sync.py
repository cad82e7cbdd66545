"""The sync side: the shared background event loop sync callers run coroutines on, and the
pump that turns an async stream into a plain iterator.

Sync entry points (`len(src)`, `src[i]`, the plain `for` loop over a loader) must work from
plain scripts and from notebooks that already run a loop. Running our coroutines on one
daemon thread with its own loop (uvloop when installed) serves both, and keeps loop-bound
resources (HTTP sessions, semaphores) on one loop for the life of the process.

Closing (a source's or a loader's `close()`) works from any thread, the loop's own included:
a finalizer or the garbage collector may run there, where waiting on the loop would wait on
itself; the closing is then started on the loop and keeps it up until done (`close_sync`).

`os.fork()` copies only the calling thread: in a forked child (a fork-based
`multiprocessing.Pool`, say) the loop's thread is gone, and waiting on it would hang for
ever. An at-fork handler forgets the parent's loop in the child, so the next sync use
there starts a fresh one (objects that hold parent-only resources, such as a running
loader, refuse at once: see `Loader`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.RLock()  # re-entered by a finalizer that a collection runs inside it
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_users: weakref.WeakSet = weakref.WeakSet()
# closings started on the loop's own thread (`close_sync`): token -> its task, once started
_pending: dict[object, asyncio.Task | None] = {}


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh loop: uvloop's when installed (faster sockets and callbacks), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide background loop, started on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()
                loop.close()  # (stopped: `stop_background_loop`)

            _thread = threading.Thread(target=run, name="aioloader-io", daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def run_sync(
    coro: Coroutine[Any, Any, T], timeout: float | None = None, *, user: object = None
) -> T:
    """Run `coro` on the background loop and wait for its result from this thread.

    `user` (an object with a `close()`) keeps the loop alive until `release(user)`.
    """
    loop = acquire(user) if user is not None else background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("run_sync() called from the aioloader background loop itself; "
                           "await the coroutine instead")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise


def on_loop_thread() -> bool:
    """Whether this is the background loop's own thread (where nothing may wait on it)."""
    return _thread is not None and _thread is threading.current_thread()


def close_sync(coro: Coroutine[Any, Any, None], *, wait: bool = True) -> None:
    """Run a closing coroutine on the background loop, from any thread: waited for, except on
    the loop's own thread (a finalizer or the garbage collector ran there), where it is
    started on the loop instead and keeps the loop up until it is done. Nothing here waits
    or takes a lock on that thread: the collector may have interrupted anything.

    `wait=False` starts it that way from any thread: a finalizer's closing, which the
    collector may run in a thread the loop itself is waiting on (one it is starting)."""
    loop = _loop
    if loop is None or loop.is_closed() or (wait and not on_loop_thread()):
        run_sync(coro)
        return
    token = object()
    _pending[token] = None
    loop.call_soon_threadsafe(_start_closing, loop, coro, token)


def _start_closing(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None],
                   token: object) -> None:
    task = _pending[token] = loop.create_task(coro)
    task.add_done_callback(lambda t: _closed(t, token))


def _closed(task: asyncio.Task, token: object) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("aioloader").warning(
            "closing on the background loop failed: %s: %s", type(task.exception()).__name__,
            task.exception())
    with _lock:
        _pending.pop(token, None)
        idle = not _users and not _pending
    if idle:
        stop_background_loop()


def acquire(user: object) -> asyncio.AbstractEventLoop:
    """Start (if needed) and return the background loop; `user` keeps it alive until
    `release(user)`."""
    loop = background_loop()
    with _lock:
        _users.add(user)
    return loop


def release(user: object) -> None:
    """`user` no longer needs the loop; the last one out stops its thread."""
    with _lock:
        _users.discard(user)
        idle = not _users and not _pending
    if idle:
        stop_background_loop()


def stop_background_loop() -> None:
    """Stop the background loop and join its thread (tests; also at interpreter exit). On
    the loop's own thread (the last user released there) it is stopped after its tasks end,
    without waiting, and its thread closes it."""
    global _loop, _thread
    with _lock:
        loop, thread = _loop, _thread
        _loop = _thread = None
    if loop is None or loop.is_closed():
        return

    async def drain() -> None:
        # closings started on the loop end first (cancelled, they would leave files open)
        closings = [t for t in list(_pending.values()) if t is not None]
        await asyncio.gather(*closings, return_exceptions=True)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await loop.shutdown_asyncgens()

    if thread is threading.current_thread():
        async def drain_and_stop() -> None:
            try:
                await drain()
            finally:
                loop.stop()

        loop.create_task(drain_and_stop())
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(drain(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    if thread is not None:
        thread.join(5)
        if not thread.is_alive():
            loop.close()


def pump(loop: asyncio.AbstractEventLoop, next_item: Callable[[], Awaitable[Any]], *,
         depth: int, closing: Callable[[], bool], check: Callable[[], None],
         on_exit: Callable[[], None], held: bool = False) -> Iterator[Any]:
    """A plain iterator over `await next_item()` (until StopAsyncIteration), run on `loop`.

    A pump task on the loop keeps up to `depth` items ready in a `queue.Queue`, so a ready
    item is taken without a round trip to the loop thread (which would have to win the GIL
    back first). A CancelledError while `closing()` (closed from another thread) ends the
    iteration like the last item; `check()` runs before each item (e.g. refuses in a forked
    child), and `on_exit()` when the iteration ends, however it ends, before the items not
    taken are dropped. A loop closed under the pump (a loader closed on the loop's own
    thread released its last user) ends the iteration after the items already handed off.
    `held`: items are tuples whose last element is None or a function
    the pump calls on the loop once the consumer took the item (a place ahead that the item
    held while it waited here); they are handed out without it.
    """
    pid = os.getpid()
    handoff: queue.Queue = queue.Queue()
    credits: list[asyncio.Semaphore] = []

    async def run() -> None:
        credits.append(asyncio.Semaphore(depth))
        try:
            while True:
                await credits[0].acquire()
                try:
                    item = await next_item()
                except StopAsyncIteration:
                    handoff.put(("end", None))
                    return
                handoff.put(("item", item))
        except BaseException as exc:  # cancelled by close(): the iteration ends
            done = isinstance(exc, asyncio.CancelledError) and closing()
            handoff.put(("end", None) if done else ("error", exc))
            raise

    pumping = None
    try:  # (Ctrl-C may come at any line: from here on, whatever started is stopped)
        pumping = asyncio.run_coroutine_threadsafe(run(), loop)
        while True:
            check()
            kind, value = handoff.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            release = None
            if held:
                *rest, release = value
                value = tuple(rest)
            try:
                loop.call_soon_threadsafe(_taken, credits[0], release)
            except RuntimeError:  # the loop closed (a close on its own thread released its
                if not loop.is_closed():  # last user): the pump is gone, and what it had
                    raise  # handed off is still the consumer's, then the "end" it put
            yield value
    finally:
        if pumping is not None and os.getpid() == pid:
            pumping.cancel()
        on_exit()
        handoff.queue.clear()  # items not taken: their memory goes now, not at a gc


def _taken(credit: asyncio.Semaphore, release: Callable[[], None] | None) -> None:
    """(On the loop) the consumer took an item: room for another in the hand-off, and the
    place it held ahead given back."""
    credit.release()
    if release is not None:
        release()


def _forget_after_fork() -> None:
    """In a forked child: the parent's loop (and its thread, which did not come along) is
    left alone, never run or closed here; the next use starts a fresh one."""
    global _lock, _loop, _thread, _users, _pending
    _lock = threading.RLock()  # another thread may have held it at the fork
    _loop = _thread = None
    _users = weakref.WeakSet()
    _pending = {}


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(stop_background_loop)
