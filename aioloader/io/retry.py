"""How one read is retried, given up on and hedged: the loop that applies a `RetryPolicy`
(a setting, kept with the others in `aioloader.options`; re-exported here).

A read is a sequence of attempts with jittered backoff between them. A stall is told by
silence, not by duration: an attempt ends when it has received nothing (no response head, no
body bytes) for `RetryPolicy.timeout` seconds, so a large download that keeps receiving bytes
is never cut, while a connection that goes silent is retried within seconds. The read's
deadline bounds every wait for an answer: no attempt waits for one past it, none starts after
it, and after a silent attempt another is made only if a whole `timeout` still fits. It starts
when the read first holds a request slot: time queued behind our own `io_concurrency` is not
the store's.

Hedging (as in "The Tail at Scale"): a request with no answer after a few times the recent
median time to a response head gets one duplicate; whichever finishes first is taken and the
other cancelled, so one slow server does not stall a batch. The bytes are the same whichever
wins (reads are pinned to the object's generation, and a hedge writes only its own buffer).
Hedges are bounded: a few in flight, and on average a small fraction of requests.

Only a backend that reports what it receives (`streams = True`: gs:// on libcurl) is watched
for silence and hedged; for the others (local files; fsspec stores, whose clients keep their
own socket timeouts) an attempt is bounded by the rest of the deadline, as all are on
Python 3.10 (no `asyncio.timeout` to cancel a request inline).

What it logs ("aioloader.retry"): each failed attempt and each hedge at DEBUG (the URL
redacted, the cause a status line or an exception's name and text: never a header); at most
once a minute, a WARNING when a read needed `MANY_ATTEMPTS` or more, or when the recent
median time to an answer passes `SLOW_S` (the store is slow, not failing).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

from ..errors import Transient, Unreachable
from ..logs import RateLimited, logger
from ..options import RetryPolicy  # (a setting: it lives with the others)
from ..urls import redact
from .gate import Gate
from .hedge import RETRIABLE as _RETRIABLE
from .hedge import Attempt, Silent, Watch, where

__all__ = ["MANY_ATTEMPTS", "SLOW_S", "GaveUp", "Retrier", "RetryPolicy", "Watch"]

log = logger("retry")
_INLINE_TIMEOUT = hasattr(asyncio, "timeout")  # Python 3.10: attempts bounded only
MANY_ATTEMPTS = 4  # a read that needed this many attempts (or half the policy's) is told of
SLOW_S = 1.0  # a median wait for an answer above this says the store is slow


class GaveUp(Exception):
    """The policy gave up on a read: after how many attempts, how long, and the last cause
    (`unreachable`: the last attempt could not connect at all)."""

    def __init__(self, attempts: int, seconds: float, cause: str,
                 unreachable: bool = False) -> None:
        super().__init__(cause)
        self.attempts, self.seconds, self.cause = attempts, seconds, cause
        self.unreachable = unreachable


class _Median:
    """The median of the last 64 waits for a response head, refreshed every 8 samples."""

    def __init__(self, size: int = 64) -> None:
        self._ring: list[float] = []
        self._size = size
        self._n = 0
        self.value: float | None = None

    def add(self, seconds: float) -> bool:
        """Add a sample; True when `value` was refreshed."""
        if len(self._ring) < self._size:
            self._ring.append(seconds)
        else:
            self._ring[self._n % self._size] = seconds
        self._n += 1
        if self._n % 8 == 0 or self.value is None:
            self.value = sorted(self._ring)[len(self._ring) // 2]
            return True
        return False

    def __len__(self) -> int:
        return len(self._ring)


# Attempts for a read that cannot connect at all (`Unreachable`): a DNS failure or a refused
# connection rarely heals within a deadline, and waiting only hides the cause.
UNREACHABLE_ATTEMPTS = 3


def _cause(exc: BaseException) -> str:
    return exc.cause if isinstance(exc, Transient) else f"{type(exc).__name__}: {exc}"



class Retrier:
    """Applies one `RetryPolicy` to the reads of one `Storage`, counting in its `IOStats`.

    A hedge is `(call, args, finish)`: the duplicate request, and what turns its result into
    the read's (None: as it is). Final errors (missing, forbidden, changed) pass through.
    """

    def __init__(self, policy: RetryPolicy, stats: Any, rng: random.Random) -> None:
        self.policy = policy
        self.stats = stats
        self._rng = rng
        self._median = _Median()
        self._cap = float(max(1, policy.max_hedges))
        self._tokens = self._cap  # hedges that may be sent now
        self._hedging = 0
        # Attempts of backends that do not report a response head: their whole latency
        # (kept apart from `_median`, which decides hedges), for the slow-store warning.
        self._latency = _Median()
        # The least median time to an answer seen (over 16+ requests): the store's round
        # trip with little queued (TCP Vegas's BaseRTT; a median, not the least sample, so
        # jitter does not set it), against which the autotuner tells queueing.
        self.base_rtt = math.inf
        self.warn_many = RateLimited(log)  # a read that needed many attempts
        self.warn_slow = RateLimited(log)  # a store slow to answer

    async def run(self, slots: Gate, call: Any, args: tuple, *, streams: bool,
                  hedge: tuple[Any, tuple, Callable[[Any], Any] | None] | None = None,
                  url: str = "", span: tuple[int, int] | None = None) -> Any:
        """`await call(*args)` until it succeeds or the policy gives up (`GaveUp`), each
        attempt holding a slot. `url` and `span` (the byte range; None: the tail) name the
        read in logs, formatted only when a line is written."""
        clock = asyncio.get_running_loop().time
        watched = streams and _INLINE_TIMEOUT
        began = deadline_at = 0.0  # set when the read first holds a slot
        attempt = 0
        cause_was = ""
        while True:
            attempt += 1
            if not slots.take():  # (`async with slots`, without an await when free)
                await slots.acquire()
            try:
                if attempt == 1:  # the deadline times the store, not our own queue
                    began = clock()
                    deadline_at = began + self.policy.deadline
                result = await self._attempt(call, args, watched, deadline_at, hedge, url,
                                             span)
            except _RETRIABLE as exc:
                failed: BaseException | None = exc
            else:
                failed = None
            finally:
                slots.release()
            if failed is None:
                if attempt >= min(MANY_ATTEMPTS, max(2, self.policy.attempts // 2)):
                    self.warn_many("%s needed %d attempts (%.1f s); the last failure: %s. The "
                                   "store is failing often (%d retries so far)",
                                   where(url, span), attempt, clock() - began, cause_was,
                                   self.stats.retries)
                return result
            delay, cause_was = self._backoff(failed, attempt, clock() - began, url, span)
            await asyncio.sleep(delay)

    async def _attempt(self, call: Any, args: tuple, watched: bool, deadline_at: float,
                       hedge: tuple[Any, tuple, Callable[[Any], Any] | None] | None,
                       url: str, span: tuple[int, int] | None) -> Any:
        """One attempt, counted: a request in flight, its time busy, a hedge token earned;
        a final error (missing, forbidden) a failure."""
        stats = self.stats
        stats.requests += 1
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        self._tokens = min(self._cap, self._tokens + self.policy.hedge_budget)
        t0 = time.monotonic()
        try:
            if watched:
                return await Attempt(self, deadline_at, hedge, url, span).run(call, args)
            result = await self._bounded(call, args, deadline_at)
            self._took(time.monotonic() - t0, url)
            return result
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            stats.failures += 1
            raise
        finally:
            stats.in_flight -= 1
            stats.busy_seconds += time.monotonic() - t0

    def _backoff(self, exc: BaseException, attempt: int, spent: float, url: str,
                 span: tuple[int, int] | None) -> tuple[float, str]:
        """After failed attempt `attempt`, `spent` seconds into the read: the delay before the
        next and the cause (redacted), or `GaveUp` when the policy allows no other."""
        policy, stats = self.policy, self.stats
        cause = _cause(exc)
        kind = cause.split(":")[0]
        stats.statuses[kind] = stats.statuses.get(kind, 0) + 1
        delay = policy.delay(attempt, self._rng)
        # After a silent attempt, the next needs a whole `timeout` before the deadline.
        need = delay + (policy.timeout if isinstance(exc, Silent) else 0.0)
        unreachable = isinstance(exc, Unreachable)
        limit = min(policy.attempts, UNREACHABLE_ATTEMPTS) if unreachable else policy.attempts
        if attempt >= limit or spent + need >= policy.deadline:
            stats.failures += 1
            log.debug("%s: attempt %d failed (%s); giving up after %.1f s",
                      where(url, span), attempt, redact(cause), spent)
            raise GaveUp(attempt, spent, cause, unreachable)
        stats.retries += 1
        cause_was = redact(cause)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: attempt %d failed (%s); retrying in %.3f s",
                      where(url, span), attempt, cause_was, delay)
        return delay, cause_was

    async def _bounded(self, call: Any, args: tuple, deadline_at: float) -> Any:
        """One call of a backend that reports nothing until it is done: the rest of the
        deadline is all it gets."""
        left = deadline_at - asyncio.get_running_loop().time()
        silent = f"no answer before the deadline ({self.policy.deadline:g} s)"
        if not hasattr(asyncio, "timeout"):  # pragma: no cover - Python 3.10
            try:
                return await asyncio.wait_for(call(*args), left)
            except asyncio.TimeoutError:
                raise Silent(silent) from None
        try:
            async with asyncio.timeout(left) as cm:
                return await call(*args)
        except TimeoutError:
            if cm.expired():
                raise Silent(silent) from None
            raise

    # -- hedges -------------------------------------------------------------------------

    def hedge_at(self, start: float) -> float:
        """When a request sent at `start` with no answer yet gets a hedge (inf: never)."""
        after = self.policy.hedge_after
        if after is None or self.policy.max_hedges == 0:
            return math.inf
        median = self._median.value
        return start + (after if median is None else
                        max(after, self.policy.hedge_multiplier * median))

    def may_hedge(self) -> bool:
        return self._tokens >= 1 and self._hedging < self.policy.max_hedges

    def hedge_sent(self) -> None:
        self._tokens -= 1
        self._hedging += 1
        stats = self.stats
        stats.hedges += 1
        stats.requests += 1
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)

    def hedge_ended(self) -> None:
        self._hedging -= 1
        self.stats.in_flight -= 1

    def answered_in(self, seconds: float, url: str = "") -> None:
        if self._median.add(seconds):
            self._slow(self._median, "first byte", url)
            self._least(self._median)

    def _took(self, seconds: float, url: str) -> None:
        """An attempt of a backend that reports no response head took `seconds`."""
        if self._latency.add(seconds):
            self._slow(self._latency, "answer", url)
            self._least(self._latency)

    def _least(self, median: _Median) -> None:
        if median.value is not None and len(median) >= 16:
            self.base_rtt = min(self.base_rtt, median.value)

    def _slow(self, median: _Median, what: str, url: str) -> None:
        value = median.value
        if value is not None and value > SLOW_S and len(median) >= 16:
            self.warn_slow("the store is slow: median time to %s %.2f s over the last %d "
                           "requests (e.g. %s); raise io_concurrency to keep more in flight",
                           what, value, len(median), redact(url) or "?")
