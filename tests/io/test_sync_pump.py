"""The sync adapter's pump (`aioloader.io.sync.pump`) when its loop goes away under it: a
loader closed from the loop's own thread releases the last user, the background loop
stops and its thread closes it, while items the pump had already handed off still wait
for the consumer. The consumer takes them and the iteration ends, as after the last item;
handing a credit back to a closed loop must not raise."""

from __future__ import annotations

import asyncio
import threading

from aioloader.io import sync


def _loop_on_a_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
        loop.close()  # (as the background loop's thread does once it is stopped)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait()
    return loop, thread


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """What `stop_background_loop` does on the loop's thread: every task cancelled, then
    the loop stopped; its thread closes it."""

    async def drain_and_stop() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        loop.stop()

    asyncio.run_coroutine_threadsafe(drain_and_stop(), loop)
    thread.join(10)
    assert loop.is_closed()


def test_items_handed_off_before_the_loop_closed_are_taken_then_the_iteration_ends():
    loop, thread = _loop_on_a_thread()
    closed = threading.Event()
    handed = asyncio.Event()  # (made on no loop: only awaited on `loop`)
    count = iter(range(1000))
    exits = []

    async def next_item() -> int:
        k = next(count)
        if k == 3:  # the hand-off holds items 1 and 2 (depth 3, item 0 taken): close now
            handed.set()
            await asyncio.sleep(3600)
        return k

    it = sync.pump(loop, next_item, depth=3, closing=closed.is_set, check=lambda: None,
                   on_exit=lambda: exits.append(1))
    assert next(it) == 0
    asyncio.run_coroutine_threadsafe(handed.wait(), loop).result(10)
    closed.set()
    _stop(loop, thread)
    rest = list(it)  # raised RuntimeError("Event loop is closed") before the fix
    assert rest == [1, 2]
    assert exits == [1]


def test_a_loop_closed_while_the_consumer_waits_ends_the_iteration():
    loop, thread = _loop_on_a_thread()
    closed = threading.Event()
    started = threading.Event()

    async def next_item() -> int:
        started.set()
        await asyncio.sleep(3600)
        return 0

    it = sync.pump(loop, next_item, depth=2, closing=closed.is_set, check=lambda: None,
                   on_exit=lambda: None)
    stopper = threading.Thread(target=lambda: (started.wait(10), closed.set(),
                                               _stop(loop, thread)))
    stopper.start()
    assert list(it) == []
    stopper.join(10)
