"""The Ray executor's calls to its actors (`Calls`): tasks wait here for an actor with room,
and go to it up to `tasks_per_call` in one call, so that the driver's own cost of a call (the
submit, the wait for its result, the hop back to the event loop) is paid once per group.

An actor has at most `CALLS_PER_ACTOR` calls at it (one running, one queued behind it, as a
worker process has): a task waits here, not behind a busy actor. An idle actor gets what
waits at once (alone if alone); a busy one gets the call to queue behind its running one
only once a whole group waits (`tasks_per_call` tasks, or one that is to go alone). Tasks
come from the runtime one at a time as results are consumed, so sending each to the first
actor with room would make every other call a single task; held for a group, they go
`tasks_per_call` a call in the steady state, and a task that waits for one goes, at the
latest, when an actor comes free (that actor idles for one hop, no longer). The runtime
keeps `tasks_per_call` times its prefetch in flight for this executor (`tasks_per_call` on
the `Executor`), so grouping leaves the actors as many calls in flight as before, each of
more records. Each task of a call runs as it would alone (`run_task`) and comes back as its
own result: the batches do not depend on how tasks were grouped.

When an actor dies every call at it fails. Only the call it was running is charged toward
its tasks' rerun limits: that is the first of them to fail, since the calls run in the
order they were sent and those before it had come back. A call queued behind a crash is not
to blame for it, and a grouped call is not charged either: its tasks run again one a call,
so that the task that takes an actor down is the one charged, and its error names it. The
tasks of every failed call go back to the front of the queue, in task order, and run again
on the other actors or on the one made in the dead one's place.

A call's tasks travel pickled, cut in pieces under Ray's default size for an argument it
sends inside the call (`call_args`): Ray puts a larger one in its object store, which costs
this process more per call, and the tasks of a call of local files' records
(their records' places) reach that size. Tasks that carry chunk bytes go as they are.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pickle
import time
from typing import Any

from ..errors import WorkerError
from .messages import Result, Task

__all__ = ["CALLS_PER_ACTOR", "Call", "Calls", "Entry", "Raised", "call_args", "pieces"]

log = logging.getLogger("aioloader")
CALLS_PER_ACTOR = 2  # one running, one queued behind it: the actor never waits for a hop
INLINE_BYTES = 96 << 10  # an argument Ray sends inside the call (its default limit: 100 KiB)
PIECES_MAX = 16  # tasks pickled larger than this many pieces go as they are


class Raised:
    """What a task of a grouped call raised in the actor (its other tasks still come back)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Entry:
    """A task waiting for its result: its future, and the actor deaths charged to it."""

    __slots__ = ("alone", "call", "deaths", "describe", "future", "task")

    def __init__(self, task: Task, describe: str, future: asyncio.Future) -> None:
        self.task, self.describe, self.future = task, describe, future
        self.deaths = 0
        self.call: Call | None = None  # the call it is in, once sent
        self.alone = False  # in a grouped call that took its actor down: sent alone since


class Call:
    """One call to an actor: its tasks in order, the calls sent to that actor before it and
    not yet back (`ahead`), and how it ended (None: not yet; "back" or "died")."""

    __slots__ = ("actor", "ahead", "at", "entries", "error", "line", "outcome", "ref", "sent",
                 "waiters")

    def __init__(self, at: int, actor: Any, entries: list[Entry], line: list[Call]) -> None:
        self.at, self.actor, self.entries = at, actor, entries
        self.line = line  # the calls at this actor (this one's: a new actor has a new one)
        self.ahead = list(line)
        self.sent = time.perf_counter_ns()
        self.ref: Any = None
        self.outcome: str | None = None
        self.waiters: list[Call] = []  # died calls behind this one, waiting for its outcome
        self.error: BaseException | None = None


class Calls:
    """The queue of tasks for `owner`'s actors (a `RayActors`), the calls at each actor,
    and what a call's outcome does: results handed on, or its tasks run again."""

    def __init__(self, owner: Any, tasks_per_call: int) -> None:
        self.owner = owner
        self.tasks_per_call = tasks_per_call
        self.pending: collections.deque[Entry] = collections.deque()
        self.lines: list[list[Call]] = [[] for _ in range(owner.workers)]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: dict[int, Any] = {}  # actors' first answers that wake `dispatch`

    def fewer(self, workers: int) -> None:
        del self.lines[workers:]

    def forget(self) -> None:
        """The actors are gone: their first answers are not waited for."""
        self._watched.clear()

    async def run(self, task: Task, describe: str) -> Result:
        """Queue `task`, send what can go, and wait for its result."""
        loop = self._loop = asyncio.get_running_loop()
        entry = Entry(task, describe, loop.create_future())
        self.pending.append(entry)
        self.dispatch()
        try:
            return await entry.future
        except asyncio.CancelledError:
            self._give_up(entry)
            call = entry.call
            if call is not None and call.outcome is None:  # (it may still write the slot)
                self.owner.slots.after(call.ref, task)
            raise

    def _give_up(self, entry: Entry) -> None:
        """A caller cancelled: its task leaves the queue, or its call is cancelled once no
        task of it is wanted."""
        call = entry.call
        if call is None:
            with contextlib.suppress(ValueError):
                self.pending.remove(entry)
        elif call.outcome is None and all(e.future.done() for e in call.entries):
            with contextlib.suppress(Exception):
                self.owner.ray.cancel(call.ref)

    def dispatch(self) -> None:
        """Send the queued tasks to the actors with room, up to `tasks_per_call` a call: to
        an idle actor what waits, to a busy one a whole group only."""
        owner = self.owner
        while self.pending:
            if owner.closed:
                self._fail_pending(RuntimeError(
                    "cannot run a task after the ray executor was closed"))
                return
            at = self._free()
            if at is None or (self.lines[at] and not self._group_waits()):
                return
            try:
                remote = owner.elsewhere(at)
            except owner.ray.exceptions.RayActorError:  # it died before its first answer
                self._lost(at, owner.actors[at])
                continue
            entries: list[Entry] = []
            while self.pending and len(entries) < self.tasks_per_call:
                if entries and self.pending[0].alone:
                    break
                entry = self.pending.popleft()
                if not entry.future.done():  # (a cancelled caller's)
                    entries.append(entry)
                    if entry.alone:
                        break
            if entries:
                self._send(at, entries, remote)

    def _group_waits(self) -> bool:
        """Whether a whole call waits: `tasks_per_call` tasks wanted, or one to go alone."""
        wanted = 0
        for entry in self.pending:
            if entry.alone:
                return True
            if not entry.future.done():  # (not a cancelled caller's)
                wanted += 1
                if wanted >= self.tasks_per_call:
                    return True
        return False

    def _free(self) -> int | None:
        """Of the actors up, the one with the fewest calls, if it has room; else None (and
        the actors not yet up wake `dispatch` when they are)."""
        owner = self.owner
        up = owner.placed.up()
        self._watch(owner.placed.ready)
        if not up:
            return None
        at = min(up, key=lambda k: len(self.lines[k]))
        return at if len(self.lines[at]) < CALLS_PER_ACTOR else None

    def _watch(self, ready: list[Any]) -> None:
        """`dispatch` again when an actor that has not answered yet does."""
        for ref in ready:
            if id(ref) not in self._watched:
                self._watched[id(ref)] = ref  # (held: an id is unique while it lives)
                ref.future().add_done_callback(lambda _: self._soon(self.dispatch))

    def _soon(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the loop (from Ray's threads)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # (a loop closed meanwhile)
                loop.call_soon_threadsafe(fn, *args)

    def _lost(self, at: int, actor: Any) -> None:
        """Actor `at` died: a new one in its place, with calls of its own."""
        if self.owner.closed:  # (its actors killed: none made again)
            return
        if self.owner.actors[at] is actor:
            self.lines[at] = []
        self.owner.replace(at, actor)

    def _send(self, at: int, entries: list[Entry], remote: bool) -> None:
        owner = self.owner
        if remote:  # the actor is to get the bytes from here
            kept = []
            for e in entries:
                try:
                    owner.read_here(e.task, e.describe)
                    kept.append(e)
                except Exception as exc:
                    e.future.set_exception(exc)
            if not (entries := kept):
                return
        line = self.lines[at]
        call = Call(at, owner.actors[at], entries, line)
        for e in entries:
            e.call = call
            owner.slots.route(e.task, not remote)
        try:
            tasks, parts = call_args([e.task for e in entries])
            call.ref = call.actor.run.remote(tasks, not remote, *parts)
        except Exception as exc:  # nothing went: each of its tasks fails, none waits
            for e in entries:
                e.call = None
                if not e.future.done():
                    e.future.set_exception(_raised(exc, e.describe))
            return
        line.append(call)
        owner.tally.calls += 1
        call.ref.future().add_done_callback(lambda f: self._soon(self._back, call, f))

    def _back(self, call: Call, done: Any) -> None:
        """A call's outcome: its results handed on, or its actor's death dealt with."""
        ray = self.owner.ray
        with contextlib.suppress(ValueError):
            call.line.remove(call)
        try:
            got = done.result()
        except ray.exceptions.RayActorError as exc:
            call.outcome, call.error = "died", exc
            self._lost(call.at, call.actor)
            self._judge(call)
        except BaseException as exc:  # raised by the call itself (e.g. no pipeline loaded)
            call.outcome = "back"
            for e in call.entries:
                if not e.future.done():
                    e.future.set_exception(_raised(exc, e.describe))
        else:
            call.outcome = "back"
            for e, result in zip(call.entries, got):
                if e.future.done():
                    continue
                if isinstance(result, Raised):
                    e.future.set_exception(_raised(result.error, e.describe))
                else:
                    if not result.needed:  # (else it runs again: counted then)
                        self.owner.tally.came_back(call.at, result, call.sent)
                    e.future.set_result(result)
        if call.outcome == "back":  # (decided: the calls ahead of it and its tasks go)
            call.ahead, call.entries = [], []
        for waiting in call.waiters:
            self._judge(waiting)
        call.waiters = []
        self.dispatch()

    def _judge(self, call: Call) -> None:
        """A call whose actor died: once every call ahead of it has its outcome, it is the
        one the actor was running if all of those came back; its tasks are charged then.
        Its tasks are queued again (or fail, past the limit)."""
        undecided = next((a for a in call.ahead if a.outcome is None), None)
        if undecided is not None:
            undecided.waiters.append(call)
            return
        ran = all(a.outcome == "back" for a in call.ahead)  # (the call the actor ran)
        entries, call.ahead, call.entries = call.entries, [], []  # (decided)
        live = [e for e in entries if not e.future.done()]
        # a call of one task is charged for its actor's death; a grouped one's tasks run
        # again one a call, so that the task that crashed is the one charged
        charged = ran and len(live) == 1
        again = []
        owner = self.owner
        for e in live:
            e.deaths += charged
            e.alone = e.alone or ran
            if ran:  # (its actor may have been writing the slot)
                owner.slots.moved(e.task)
            if e.deaths > owner.kind.max_reruns:
                e.future.set_exception(WorkerError(
                    f"{e.describe}: its Ray actor died {e.deaths} times ({call.error}); a "
                    "transform may crash the interpreter (run with workers=0 to debug), or "
                    "the cluster lost its nodes"))
                continue
            e.call = None
            owner.counts["reruns"] += 1
            log.warning("a Ray actor died while %s %s; it runs again",
                        "running" if ran else "it waited to run", e.describe)
            again.append(e)
        if again:  # (first, in task order: the consumer waits for the earliest)
            queued = sorted([*again, *self.pending], key=lambda e: e.task.task_id)
            self.pending = collections.deque(queued)
        self.dispatch()

    def _fail_pending(self, exc: BaseException) -> None:
        while self.pending:
            entry = self.pending.popleft()
            if not entry.future.done():
                entry.future.set_exception(exc)


def _raised(exc: BaseException, describe: str) -> BaseException:
    """A task's error as a worker process's would be: a `WorkerError` naming the task, or
    the transform's own exception as it was."""
    cause = getattr(exc, "cause", None) or exc  # (a RayTaskError's)
    if isinstance(cause, WorkerError):
        return WorkerError(f"{describe}: {cause}")
    return cause


def call_args(tasks: list[Task]) -> tuple[list[Task] | None, list[bytes]]:
    """How a call's tasks travel: pickled, in pieces Ray sends inside the call (None, the
    pieces). Ray puts a larger argument in its object store instead, which costs this
    process more per call (the tasks of a call of local files' records reach
    that size). Tasks with chunk bytes, or pickled larger than `PIECES_MAX` pieces, go as
    they are (the tasks, no pieces): through the object store, as one object."""
    if any(t.raws is not None for t in tasks):
        return tasks, []
    blob = pickle.dumps(tasks, protocol=pickle.HIGHEST_PROTOCOL)
    if len(blob) > INLINE_BYTES * PIECES_MAX:
        return tasks, []
    return None, pieces(blob, INLINE_BYTES)


def pieces(blob: bytes, size: int) -> list[bytes]:
    """`blob` cut in order into pieces of at most `size` bytes (one piece if it is empty)."""
    return [blob[k:k + size] for k in range(0, len(blob), size)] or [blob]
