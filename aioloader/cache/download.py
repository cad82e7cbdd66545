"""Segments onto the disk tier: each downloaded once per host, and the background filler.

A segment is downloaded by whichever process takes its lock first (`DiskCache.try_lock`),
checked for room before a byte is fetched, and stored; the others wait for that process and
then find it on disk (the filler skips it and comes back later). Concurrent asks within this
process share one download. The filler downloads every segment not on disk, file by file,
a few at a time (a bounded share of `io_concurrency`), once the first read is done, so the
first batch does not wait behind whole segments; it stops when every segment is on disk, or
when the cache refuses one (full of recently used entries): the memory tier then stores
none for a while (`full`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from .disk import entry_size

log = logging.getLogger("aioloader")

_POLL_S = (0.005, 0.25)  # waiting for another process's download: first, most
DISK, BUSY, FULL, SKIP = "disk", "busy", "full", "skip"  # how a segment request ended
FULL_BACKOFF_S = 10.0  # after the cache refused a segment, the memory tier stores none


class Downloads:
    """The downloads of the segments of one disk tier (`tier`: a `cache.tier.DiskTier`, its
    segments' keys and states, its cache, storage and disk threads)."""

    def __init__(self, tier: Any) -> None:
        self.tier = tier
        self.count = 0  # segments this process downloaded
        self.filled = False  # the filler finished: everything it could store is on disk
        self._full_until = 0.0
        self._inflight: dict[int, asyncio.Future] = {}
        self._filler: asyncio.Task | None = None
        self._lanes = 0  # the filler's concurrency, once asked for
        self._first_done = False

    @property
    def full(self) -> bool:
        """The cache refused a segment lately: store none (and scan nothing) for now."""
        return time.monotonic() < self._full_until

    async def segment(self, r: int, wait: bool, box: list | None = None) -> str:
        """Make segment `r` be on disk (DISK), shared with whoever asks meanwhile; BUSY:
        another process downloads it now (`wait=False`); FULL: no room; SKIP: a file
        without a version. `box` ([dest, False]): download into dest (and say so)."""
        if self.tier.have[r]:
            return DISK
        fut = self._inflight.get(r)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = self._inflight[r] = asyncio.get_running_loop().create_future()
        try:
            status = await self._ensure(r, wait, box)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as err:
            fut.set_exception(err)
            fut.exception()  # retrieved: a waiter, if any, sees it
            raise
        else:
            fut.set_result(status)
        finally:
            self._inflight.pop(r, None)
        return status

    async def _ensure(self, r: int, wait: bool, box: list | None) -> str:
        tier = self.tier
        if not tier.cacheable[r]:
            return SKIP
        key, cache = tier.keys[r], tier.cache
        if await tier.found(r):
            return DISK
        delay = _POLL_S[0]
        while (lock := cache.try_lock(key)) is None:  # ~20 µs: never left to a thread
            if not wait:
                return BUSY
            await asyncio.sleep(delay)  # another process is downloading it
            delay = min(2 * delay, _POLL_S[1])
        try:
            if await tier.found(r):  # stored by the process we waited for
                return DISK
            if not await tier.thread(cache.make_room, entry_size(key.end - key.start)):
                self._full_until = time.monotonic() + FULL_BACKOFF_S
                return FULL  # checked before downloading: no bytes fetched for nothing
            if box is None:
                data: Any = await tier.storage.read(key.url, key.start, key.end)
            else:
                data = box[0][: key.end - key.start]
                await tier.storage.read_into(key.url, key.start, key.end, data)
                box[1] = True
            self.count += 1
            known = await tier.thread(cache.store, key, data)
        finally:
            lock.release()
        if known is None:
            self._full_until = time.monotonic() + FULL_BACKOFF_S
            return FULL
        tier.mark(r, known)
        return DISK

    # -- the background filler ----------------------------------------------------------

    def start_filler(self, concurrency: int, *, now: bool = False) -> None:
        """Download every segment not on disk, `concurrency` at a time, in the background:
        once the first read is done (`now`: at once)."""
        self._lanes = max(1, concurrency)
        if now or self._first_done:
            self._start_fill()

    def first_read_done(self) -> None:
        """The tier's first read from the bucket is done: the filler may start."""
        if not self._first_done:
            self._first_done = True
            self._start_fill()

    def _start_fill(self) -> None:
        if self._filler is None and self._lanes and len(self.tier):
            self._filler = asyncio.ensure_future(self._fill(self._lanes))

    async def _fill(self, concurrency: int) -> None:
        full = False
        cacheable = self.tier.cacheable

        async def lane(todo: list[int], wait: bool, skipped: list[int]) -> None:
            nonlocal full
            while todo and not full:
                r = todo.pop()
                if not cacheable[r]:
                    continue
                status = await self.segment(r, wait)
                if status == FULL:
                    full = True  # refused: the cache holds what it can
                elif status == BUSY:
                    skipped.append(r)

        try:
            for wait in (False, True):  # a segment being downloaded elsewhere: later
                todo = [int(r) for r in np.flatnonzero(~self.tier.have)[::-1]]
                skipped: list[int] = []
                await asyncio.gather(*(lane(todo, wait, skipped) for _ in range(concurrency)))
                if full or not skipped:
                    break
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the filler only saves time: reads go on without it
            log.warning("disk cache: background fill stopped: %s", err)
        self.filled = True

    async def aclose(self) -> None:
        """Stop the filler."""
        t, self._filler = self._filler, None
        if t is not None:
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
