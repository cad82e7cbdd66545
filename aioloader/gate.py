"""`Gate`: an asyncio semaphore whose limit can change while it is in use, and which keeps
the time-weighted count of holders (how full it was), for the autotuner.

Growing releases the new permits at once; shrinking takes free permits away at once and
the rest as holders release (a debt), so holders never exceed the new limit for longer
than the calls already inside take. A leaf: storage and the runtime both use it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

__all__ = ["Gate"]


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
