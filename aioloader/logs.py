"""The package's loggers, and warnings that come at most once a while.

Everything aioloader logs goes to `logging.getLogger("aioloader")` or a child of it
("aioloader.retry", "aioloader.storage", "aioloader.source"), so one line turns it all on:
`logging.getLogger("aioloader").setLevel(logging.DEBUG)`. What goes where:

- DEBUG: each retried attempt (cause, delay), each hedge sent or won, a backend opened.
- INFO: a dataset opened (files, records, codec, group size).
- WARNING: a read that needed many attempts, a store that answers slowly (rate-limited:
  a flaky bucket gives one line a minute, not one per request), and what degrades quietly
  (caches not written, workers not used).

Nothing logged carries a credential: URLs pass through `urls.redact` first (the retry's
causes are status lines and exception names, never headers), and tests/test_secrets.py
checks every record of a real failing run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RateLimited", "logger"]


def logger(part: str = "") -> logging.Logger:
    """`aioloader`'s logger, or its child `aioloader.<part>`."""
    return logging.getLogger(f"aioloader.{part}" if part else "aioloader")


class RateLimited:
    """Logs at `level` at most once every `every` seconds; a line held back is counted, and
    the count is told in the next line that goes out ("3 more since the last"), so a flaky
    bucket cannot flood the log but the count is never lost."""

    __slots__ = ("_clock", "_log", "every", "held", "level", "next_at")

    def __init__(self, log: logging.Logger, every: float = 60.0, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self.every = every
        self.level = level
        self._clock = clock
        self.next_at = -float("inf")
        self.held = 0  # lines held back since the last that went out

    def __call__(self, msg: str, *args: Any) -> bool:
        """Log `msg % args` now, unless a line went out less than `every` s ago (True: it
        went out)."""
        if not self._log.isEnabledFor(self.level):
            return False
        now = self._clock()
        if now < self.next_at:
            self.held += 1
            return False
        self.next_at = now + self.every
        if self.held:
            msg += " (%d more like this since the last)"
            args = (*args, self.held)
            self.held = 0
        self._log.log(self.level, msg, *args)
        return True
