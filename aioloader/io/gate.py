"""`Gate`: an asyncio semaphore whose limit can change while it is in use, and which keeps
the time-weighted count of holders (how full it was), for the autotuner; and `ByteBudget`,
the same admission by bytes in flight (storage's memory budget for range reads).

Growing releases the new permits at once; shrinking takes free permits away at once and
the rest as holders release (a debt), so holders never exceed the new limit for longer
than the calls already inside take. A leaf: storage and the runtime both use it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

__all__ = ["ByteBudget", "Gate"]


class Gate(asyncio.Semaphore):
    """A semaphore of `limit` permits; `resize(n)` changes the limit; `held_seconds()` is the
    integral of holders over time (divide a difference by elapsed x limit: its occupancy)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        super().__init__(limit)
        self.limit = limit
        self.held = 0
        self._debt = 0  # permits to swallow on release (after shrinking)
        self._integral = 0.0
        self._mark = time.perf_counter()

    def _tick(self, delta: int) -> None:
        now = time.perf_counter()
        self._integral += self.held * (now - self._mark)
        self._mark = now
        self.held += delta

    async def acquire(self) -> Literal[True]:
        await super().acquire()
        self._tick(1)
        return True

    def take(self) -> bool:
        """Acquire now if a permit is free and nobody waits, without awaiting (the common
        case, once per request); False: `await acquire()` instead."""
        if self._value > 0 and not self._waiters:
            self._value -= 1
            self._tick(1)
            return True
        return False

    def release(self) -> None:
        self._tick(-1)
        if self._debt:
            self._debt -= 1
            return
        super().release()

    def held_seconds(self) -> float:
        self._tick(0)
        return self._integral

    def resize(self, limit: int) -> None:
        """Make the limit `limit` (>= 1) from now on."""
        limit = max(1, int(limit))
        delta, self.limit = limit - self.limit, limit
        if delta > 0:
            paid = min(delta, self._debt)
            self._debt -= paid
            for _ in range(delta - paid):
                super().release()
        elif delta < 0:
            free = min(-delta, self._value)  # asyncio.Semaphore's count of free permits
            self._value -= free
            self._debt += -delta - free


class ByteBudget:
    """Waits until `n` more bytes fit under the budget (one oversized read may run alone).

    The uncontended path takes no lock and never yields: it runs once per range read.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: list[tuple[int, asyncio.Future]] = []

    def _fits(self, n: int) -> bool:
        return self.used == 0 or self.used + n <= self.limit

    def take(self, n: int) -> bool:
        """Hold `n` bytes now if they fit and nobody waits, without awaiting; False:
        `await acquire(n)` instead."""
        if not self._waiters and self._fits(n):
            self.used += n
            return True
        return False

    async def acquire(self, n: int) -> None:
        if self.take(n):
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.used -= n  # granted just as we were cancelled: give it back
                self._wake()
            else:
                self._waiters = [w for w in self._waiters if w[1] is not fut]
            raise

    def release(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, fut = self._waiters.pop(0)
            if not fut.done():
                self.used += n
                fut.set_result(None)
