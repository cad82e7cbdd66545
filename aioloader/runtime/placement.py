"""Device placement off the consumer's thread: `loader.to_jax()` and `to_jax_async()`.

A placement thread takes the host batches from the loader and places them
(`aioloader.jax.Placement`: `device_put` with the sharding, or the multi-host assembly), so
`next()` hands over arrays already on the devices, with the state after that batch. At most
`prefetch_to_device` placed batches are alive at once, the one last handed out included, as
when they were placed inside `next()`; an error in placement is raised by the `next()` that
would have returned that batch, and names it. The jax-specific part is `aioloader.jax`,
imported when an iterator is made.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..io.sync import run_sync

if TYPE_CHECKING:
    from ..jax import Placement

_END = object()  # the feed's last item
_LOOK_S = 0.1  # how often a thread waiting for room looks whether its loader was closed


class _Feed:
    """The placement thread: it takes host batches from the loader's plain iterator, places
    them, and queues `(arrays, state after the batch)`. At most `depth` placed batches are
    alive at once: the queued ones and the one last handed out, given back when the next is
    asked for (as when they were placed inside `next()`)."""

    def __init__(self, placement: Placement, depth: int) -> None:
        self.placement = placement
        self.batches = iter(placement.loader)
        self.free = depth
        self.out: collections.deque = collections.deque()
        self.held = False  # the consumer holds the last batch handed out
        self.stopped = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="aioloader-placement",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        item: Any = _END
        try:
            while not self.stopped:
                real = True
                try:
                    batch = next(self.batches)
                except StopIteration:
                    batch, real = self.placement.filler(), False
                    if batch is None:
                        break
                state = self.placement.loader.get_state()  # (this thread drives the loader)
                with self.cond:
                    while not self.free and not self.stopped:
                        # (a loader closed under a live iterator ends the wait too)
                        if self.placement.loader.closed:
                            self.stopped = True
                        else:
                            self.cond.wait(_LOOK_S)
                    if self.stopped:
                        break
                    self.free -= 1
                arrays = self.placement.place(batch, real)
                with self.cond:
                    self.out.append((arrays, state))
                    self.cond.notify_all()
        except BaseException as exc:
            item = exc
        finally:
            self.batches.close()  # (closes the loader, as the end of a `for` loop does)
            with self.cond:
                self.out.append(item)
                self.cond.notify_all()

    def take(self) -> tuple[Any, dict[str, Any]]:
        """The next placed batch and its state; its error; or StopIteration."""
        with self.cond:
            if self.held:
                self.free += 1
                self.held = False
                self.cond.notify_all()
            while not self.out:
                self.cond.wait()
            item = self.out[0]
            if isinstance(item, tuple):
                self.out.popleft()
                self.held = True
                return item
            self.out[0] = _END  # an error is raised once; then the iteration has ended
        self.join()
        if item is _END:
            raise StopIteration
        raise item

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def join(self) -> None:
        if self.thread is not threading.current_thread():
            self.thread.join()


class _Placed:
    """What both iterators hold: the placement, its depth, and the state handed out."""

    def __init__(self, loader: Any, sharding: Any = None, *, prefetch_to_device: int = 2,
                 pad_final: bool = False) -> None:
        from ..jax import Placement  # (the package imports without jax)

        self._placement = Placement(loader, sharding, pad_final)
        self.loader = loader
        self.depth = max(1, prefetch_to_device)
        self.state: dict[str, Any] = loader.get_state()

    def get_state(self) -> dict[str, Any]:
        """The loader state after the last batch this iterator *returned* (not prefetched)."""
        return self.state


class DeviceIterator(_Placed):
    """`for arrays in loader.to_jax(sharding)`: a placement thread puts the batches on the
    devices up to `prefetch_to_device` ahead, so `next()` hands over placed arrays."""

    def __init__(self, loader: Any, sharding: Any = None, *, prefetch_to_device: int = 2,
                 pad_final: bool = False) -> None:
        super().__init__(loader, sharding, prefetch_to_device=prefetch_to_device,
                         pad_final=pad_final)
        self._feed: _Feed | None = None  # from the first step

    def __iter__(self) -> DeviceIterator:
        return self

    def __next__(self) -> Any:
        if self._feed is None:
            run_sync(self._placement.setup(), user=self.loader)
            self._feed = _Feed(self._placement, self.depth)
            weakref.finalize(self, self._feed.stop)  # dropped unclosed: its thread ends
        arrays, self.state = self._feed.take()
        return arrays

    def close(self) -> None:
        """Stop placing and close the loader, from any thread; the placement thread is
        gone when this returns."""
        feed = self._feed
        if feed is not None:
            feed.stop()
        self.loader.close()  # (ends the thread's wait for a host batch)
        if feed is not None:
            feed.join()


class AsyncDeviceIterator(_Placed):
    """`async for arrays in loader.to_jax_async(sharding)`: a task on the loader's loop takes
    the batches, and one placement thread places them (`prefetch_to_device` ahead)."""

    def __init__(self, loader: Any, sharding: Any = None, *, prefetch_to_device: int = 2,
                 pad_final: bool = False) -> None:
        super().__init__(loader, sharding, prefetch_to_device=prefetch_to_device,
                         pad_final=pad_final)
        self._task: asyncio.Task | None = None
        self._out: asyncio.Queue = asyncio.Queue()
        self._held = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __aiter__(self) -> AsyncDeviceIterator:
        return self

    async def __anext__(self) -> Any:
        if self._task is None:
            await self._placement.setup()
            self._free = asyncio.Semaphore(self.depth)
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="aioloader-placement")
            self._task = asyncio.ensure_future(_feed_async(
                self._placement, self._pool, self._free, self._out))
            loop = asyncio.get_running_loop()
            weakref.finalize(self, _cancel_soon, loop, self._task)
        if self._held:
            self._free.release()
            self._held = False
        item = await self._out.get()
        if isinstance(item, tuple):
            self._held = True
            arrays, self.state = item
            return arrays
        self._out.put_nowait(_END)  # an error is raised once; then the iteration has ended
        await self.aclose()
        if item is _END:
            raise StopAsyncIteration
        raise item

    async def aclose(self) -> None:
        """Stop placing (the loader is the caller's to close); no thread is left."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)


async def _feed_async(placement: Placement, pool: concurrent.futures.Executor,
                      free: asyncio.Semaphore, out: asyncio.Queue) -> None:
    loop = asyncio.get_running_loop()
    item: Any = _END
    try:
        while True:
            real = True
            try:
                batch = await placement.loader.__anext__()
            except StopAsyncIteration:
                batch, real = placement.filler(), False
                if batch is None:
                    break
            state = placement.loader.get_state()
            await free.acquire()
            out.put_nowait((await loop.run_in_executor(pool, placement.place, batch, real),
                            state))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        item = exc
    finally:
        out.put_nowait(item)
        pool.shutdown(wait=False)  # (its thread ends once idle)


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
    if not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)
