"""One attempt of a read, watched and hedged: what a request has received (`Watch`), the
timer that tells silence from a slow answer and sends the hedge (`Attempt`), and the
exception a silent attempt ends with (`Silent`). The retry loop around attempts, and the
policy, are `aioloader.retry`'s; this module is what happens inside one of them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import Transient
from ..logs import logger
from ..options import RetryPolicy
from ..urls import redact

__all__ = ["RETRIABLE", "Attempt", "Budget", "Silent", "Watch", "where"]

log = logger("retry")  # (one logger for retries and hedges: users filter on it)
RETRIABLE = (Transient, ConnectionError, TimeoutError)


def where(url: str, span: tuple[int, int] | None) -> str:
    """A read as logs name it: the URL redacted, and its byte range (None: its tail)."""
    return redact(f"{url} [{span[0]}, {span[1]})" if span else f"{url} (its tail)")


class Watch:
    """What one request has received, told by its backend: `answered()` at the response head,
    `progress()` at each body chunk. `last` starts at its attempt's start (a hedge's start is
    not progress). Times are the event loop's clock."""

    __slots__ = ("_clock", "answered_at", "last", "sent")

    def __init__(self, clock: Callable[[], float], sent: float, last: float) -> None:
        self._clock = clock
        self.sent = sent
        self.last = last
        self.answered_at: float | None = None

    def answered(self) -> None:
        self.answered_at = self.last = self._clock()

    def progress(self) -> None:
        self.last = self._clock()


class Budget(Protocol):
    """What an attempt asks of the `Retrier` that runs it (`aioloader.retry`): the policy and
    the store's counters, when a hedge is due and whether one may go, and where the times
    to an answer are told."""

    @property
    def policy(self) -> RetryPolicy: ...
    @property
    def stats(self) -> Any: ...
    def hedge_at(self, start: float) -> float: ...
    def may_hedge(self) -> bool: ...
    def hedge_sent(self) -> None: ...
    def hedge_ended(self) -> None: ...
    def answered_in(self, seconds: float, url: str = "") -> None: ...


class Attempt:
    """One attempt of a backend that reports its progress (`streams`).

    The first request runs inline under a cancel scope (this task, cancelled by `_stop`), so
    a fast read costs one timer and no task. The timer looks at what the requests received:
    silence (no head and no bytes for `timeout`, or no head by the deadline) ends the attempt;
    a head slow to come sends the hedge, as a task. If the hedge finishes first, the scope
    cancels the first request and the hedge's result is taken; if the first finishes first,
    the hedge is cancelled; if one fails, the other may still win.
    """

    __slots__ = ("_r", "clock", "deadline_at", "first", "first_done", "hedge", "hedge_at",
                 "hedge_task", "hedge_watch", "loop", "outcome", "span", "start", "task",
                 "timer", "url")

    def __init__(self, retrier: Budget, deadline_at: float,
                 hedge: tuple[Any, tuple, Callable[[Any], Any] | None] | None,
                 url: str = "", span: tuple[int, int] | None = None) -> None:
        self._r = retrier
        self.url, self.span = url, span
        self.loop = asyncio.get_running_loop()
        self.clock = self.loop.time
        self.start = self.clock()
        self.deadline_at = deadline_at
        self.first = Watch(self.clock, self.start, self.start)
        self.first_done = False
        self.hedge = hedge
        self.hedge_at = retrier.hedge_at(self.start) if hedge is not None else math.inf
        self.hedge_task: asyncio.Task | None = None
        self.hedge_watch: Watch | None = None
        self.outcome: str | None = None  # "hedge" (it won), or why the attempt fell silent
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None

    async def run(self, call: Any, args: tuple) -> Any:
        # The attempt's cancel scope, by hand (as `asyncio.timeout` does it, at a third of
        # its cost per request): `_stop` cancels this task, and the cancellation is turned
        # into the outcome here, unless the task was also cancelled from outside.
        task = self.task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()  # type: ignore[attr-defined,unused-ignore]  # 3.11+
        try:
            try:
                self._arm()
                try:
                    return await call(*args, watch=self.first)
                except RETRIABLE:
                    self.first_done = True
                    if self.hedge_task is None:
                        raise
                    await asyncio.wait([self.hedge_task])  # it may still win
            except asyncio.CancelledError:
                if self.outcome is None or task.uncancel() > cancelling:  # type: ignore[attr-defined,unused-ignore]
                    raise  # not ours, or not only ours
                if self.outcome != "hedge":
                    raise Silent(self.outcome) from None
            return self._hedge_result()
        finally:
            self.first_done = True
            self.outcome = self.outcome or "ended"  # a late hedge changes nothing now
            if self.timer is not None:
                self.timer.cancel()
            if self.hedge_task is not None and not self.hedge_task.done():
                self.hedge_task.cancel()  # it writes only its own buffer: no need to wait
            for w in (self.first, self.hedge_watch):
                if w is not None and w.answered_at is not None:
                    self._r.answered_in(w.answered_at - w.sent, self.url)

    def _hedge_result(self) -> Any:
        """The hedge's result as the read's (its exception if it failed)."""
        task = self.hedge_task
        assert task is not None
        result = task.result()
        self._r.stats.hedge_wins += 1
        log.debug("%s: the hedge finished first, %.3f s after the first request",
                  where(self.url, self.span), self.clock() - self.start)
        finish = self.hedge[2] if self.hedge is not None else None
        return finish(result) if finish is not None else result

    def _live(self) -> list[Watch]:
        live = [] if self.first_done else [self.first]
        if self.hedge_task is not None and not self.hedge_task.done():
            live.append(self.hedge_watch)  # type: ignore[arg-type]
        return live

    def _arm(self) -> None:
        """The first timer: what `_check` sets at the start, nothing heard yet (silence or
        the deadline, or the hedge if sooner), without its general bookkeeping."""
        wake = min(self.start + self._r.policy.timeout, self.deadline_at, self.hedge_at)
        if wake <= self.clock():
            self._check()  # due already (no time left, or hedging at once): as it says
        else:
            self.timer = self.loop.call_at(wake, self._check)

    def _check(self) -> None:
        """The timer: end the attempt if it fell silent, send the hedge when due, re-arm."""
        self.timer = None
        if self.outcome is not None:
            return
        now = self.clock()
        live = self._live()
        if not live:
            return
        timeout = self._r.policy.timeout
        last = max(w.last for w in live)
        answered = any(w.answered_at is not None for w in live)
        silent_at = last + timeout if answered else min(last + timeout, self.deadline_at)
        if now >= silent_at:
            if answered:
                self._stop(f"no bytes for {timeout:g} s in the middle of the body")
            elif self.deadline_at < last + timeout:
                self._stop(f"no answer before the deadline ({self._r.policy.deadline:g} s)")
            else:
                self._stop(f"no answer within {timeout:g} s")
            return
        wake = silent_at
        if self.hedge_task is None and self.first.answered_at is None and not self.first_done:
            if now >= self.hedge_at:
                self.hedge_at = math.inf  # decided: one hedge per attempt at most
                if now < self.deadline_at and self._r.may_hedge():
                    self._send_hedge()
            else:
                wake = min(wake, self.hedge_at)
        self.timer = self.loop.call_at(wake, self._check)

    def _send_hedge(self) -> None:
        assert self.hedge is not None
        call, args, _ = self.hedge
        self.hedge_watch = watch = Watch(self.clock, self.clock(), self.start)
        self.hedge_task = task = self.loop.create_task(call(*args, watch=watch))
        self._r.hedge_sent()
        task.add_done_callback(self._hedge_done)
        log.debug("%s: no answer after %.3f s: sent a hedge", where(self.url, self.span),
                  self.clock() - self.start)

    def _hedge_done(self, task: asyncio.Task) -> None:
        self._r.hedge_ended()
        if not task.cancelled() and task.exception() is None and not self.first_done:
            self._stop("hedge")  # it won: stop the first request

    def _stop(self, outcome: str) -> None:
        """End the first request now (from a loop callback: the timer, the hedge's end)."""
        if self.outcome is None:
            self.outcome = outcome
            assert self.task is not None
            self.task.cancel()


class Silent(Transient):
    """An attempt that heard nothing for too long (retried, unless a whole timeout no longer
    fits before the deadline)."""
