"""The "ray" executor: tasks run on Ray actors, one task at a time each, with the code a
worker process runs (`run_task`). An actor on this host stacks each finished batch in a
shared-memory slot of the executor's, as a worker process does, and the batch is lent from
there (`rayslots`); one on another node sends it back by value through Ray's object store
(NumPy arrays arrive as read-only views of it: no copy in this process).

`RayExecutor` is the kind (`executor=al.RayExecutor(...)`, or `"ray"` for its defaults);
`RayActors` the executor it opens. The Ray cluster is the user's when `ray.init()` was
called before the loader starts; else one is started (or `address` connected to) for this
process's loaders, and shut down when the last of them closes (`raycluster`). Each actor
loads the pipeline once (the same per-op pickles a worker process gets, so an op that
cannot load is named) and keeps its share of the decoded-chunk cache across tasks. The
bytes of a remote file are fetched here, by the byte path, and travel with the task (each
chunk once): the actors never talk to the bucket. An actor on this host reads local files
(and the memory copy of a remote dataset) itself; for one on another node (`read_here`: by
default, decided per actor from its node), this process reads the task's chunks and sends
them with it: the nodes need aioloader and the pipeline's code, not the files.

Tasks go to the actors up to `tasks_per_call` in one call (`raycalls`): a call costs this
process about as much as a task did, and the runtime keeps `tasks_per_call` times its
prefetch in flight, so the actors have as many calls at them as a worker process has tasks.
An actor that dies (killed, its node lost, a transform that crashes the interpreter) has
its tasks run again on a new actor in its place: a task's output is a pure function of the
task, so nothing is lost and nothing comes twice; a task in the call it was running when
it died `max_reruns + 1` times fails with a `WorkerError`. No more tasks are at the actors
than the runtime runs at once (its window, and with workers="auto" the tuner's gate).
Ray is imported only here (and by `raycluster`, which keeps a cluster started for the
loaders), and only when an executor opens: `import aioloader` never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from concurrent.futures import Future, InvalidStateError
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..errors import WorkerError
from ..io.gate import Gate
from .executor import CLOSE_GRACE_S, gate_limit
from .extract import StashFile
from .inputs import as_bytes
from .localfiles import LocalFiles
from .messages import Pipeline, Result, Task
from .rayactor import RayActor
from .raycalls import Calls
from .raycluster import CLUSTER, import_ray
from .rayplace import Placement
from .rayslots import RaySlots
from .raytally import Tally
from .worker import _pack_pipeline

__all__ = ["RAY", "RayActors", "RayExecutor"]

log = logging.getLogger("aioloader")
MAX_RERUNS = 2  # actors a task may take down before it fails: a kill is not a crash
TASKS_PER_CALL = 4  # tasks one call to an actor carries at most (see `raycalls`)


class RayExecutor:
    """The "ray" executor kind: `workers` Ray actors of `num_cpus_per_actor` CPUs each, on
    the cluster at `address` (None: the one `ray.init()` made, else a local one started for
    the loader); `init_options`: more `ray.init` arguments for a cluster started here;
    `max_reruns`: actors a task may take down (each death reruns it on a new actor) before
    it fails; `tasks_per_call`: tasks one call to an actor carries at most, while the
    actors are busy (the runtime then keeps that many times its prefetch in flight);
    `read_here`: this process reads the chunks of local files (and of a remote
    dataset's memory copy) and sends them with each task, as it does a bucket's: None (the
    default) for the actors on other nodes than this one, True for all, False for none (the
    nodes then share the files' paths)."""

    name = "ray"

    def __init__(self, num_cpus_per_actor: float = 1, address: str | None = None, *,
                 init_options: dict[str, Any] | None = None,
                 max_reruns: int = MAX_RERUNS, read_here: bool | None = None,
                 tasks_per_call: int = TASKS_PER_CALL) -> None:
        if not num_cpus_per_actor > 0:
            raise ValueError(f"num_cpus_per_actor must be > 0, got {num_cpus_per_actor!r}")
        for name, value, least in (("max_reruns", max_reruns, 0),
                                   ("tasks_per_call", tasks_per_call, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        self.tasks_per_call = tasks_per_call
        self.num_cpus_per_actor = num_cpus_per_actor
        self.address = address
        self.init_options = dict(init_options or {})
        self.max_reruns = max_reruns
        self.read_here = read_here

    def prepare(self, dataset: Any) -> None:
        """A transform that cannot travel to an actor is refused before any starts
        (`kinds.prepare`; no worker server: the actors are Ray's processes)."""
        dataset.check_picklable()

    def __repr__(self) -> str:
        return (f"RayExecutor(num_cpus_per_actor={self.num_cpus_per_actor!r}, "
                f"address={self.address!r})")

    def open(self, pipeline: Pipeline, workers: int, *, slots: int, slot_size: int,
             lanes: int | None, first_in_parent: bool) -> RayActors:
        """Actors are made by `warm_up` (or the first task), off the event loop: starting a
        local cluster takes seconds. The actors on this host get `slots × tasks_per_call`
        slots of `slot_size` bytes (the runtime's window scales by `tasks_per_call`);
        `first_in_parent`: no task runs in this process."""
        import_ray()  # the extra's error now, not at the first task
        return RayActors(self, pipeline, workers, lanes=lanes, auto=lanes is not None,
                         slots=RaySlots(slots * self.tasks_per_call, slot_size))


class RayActors:
    """Runs tasks on Ray actors (an `Executor`): the tasks go in calls (`raycalls.Calls`) to
    the actor with the fewest calls at it; results come back in `slots` (`rayslots`) from
    the actors on this host, by value from the others."""

    spills = False  # (actors on other nodes cannot open a file of this host)
    # chunks that fit each actor's cache (whatever their format keeps) are decoded by each
    # actor, not shared through the stash (`runtime.horizons`): actors on other nodes
    # cannot read this host's file
    stash_shared = False

    def __init__(self, kind: RayExecutor, pipeline: Pipeline, workers: int, *,
                 lanes: int | None = None, auto: bool = False,
                 slots: RaySlots | None = None) -> None:
        if workers < 1:
            raise ValueError("the ray executor has at least one actor (0: `Inline`)")
        self.kind = kind
        self.pipeline = pipeline
        self.workers = workers
        self.cache_bytes = pipeline.chunk_cache_bytes // workers
        self.stash = StashFile(pipeline.chunk_cache_bytes)
        self.slots = slots or RaySlots(1, 32 << 20)
        self.tasks_per_call = kind.tasks_per_call  # (the runtime's window scales by it)
        self._gate = None if lanes is None else Gate(self._limit(lanes))
        self._pid = os.getpid()
        self._auto = auto  # workers="auto": no more actors than the cluster's CPUs hold
        self._lock = threading.Lock()
        self._start: threading.Thread | None = None
        self._started: Future = Future()  # set once the actors are made (or failed)
        self._closed = False
        self._own_cluster = False  # joined `CLUSTER` (to leave at close)
        self._actor_class: Any = None
        self._parts: Any = None  # the pipeline in the object store, once for all actors
        self._actors: list[Any] = []
        self._placed = Placement(kind.num_cpus_per_actor)  # which actors have started
        self._remote: list[bool | None] = [kind.read_here] * workers  # read_here, per actor
        self._node: str | None = None  # this process's node
        self._files: LocalFiles | None = None  # what this process reads for `read_here`
        self.tally = Tally(workers)
        self.counts = self.tally.counts
        self.ray: Any = None
        self._calls = Calls(self, kind.tasks_per_call)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def actors(self) -> list[Any]:
        return self._actors

    @property
    def placed(self) -> Placement:
        return self._placed

    def _limit(self, lanes: int) -> int:
        """Tasks let at the actors for `lanes` busy ones: a worker pool's, per call."""
        return gate_limit(lanes, self.workers) * self.tasks_per_call

    # -- start ----------------------------------------------------------------------

    def warm_up(self) -> None:
        """Connect to the cluster (or start a local one) and make the actors, on a thread."""
        with self._lock:
            if self._start is None and not self._closed:
                self._start = threading.Thread(target=self._make, name="aioloader-ray-start",
                                               daemon=True)
                self._start.start()

    def _make(self) -> None:
        """Join the cluster (`CLUSTER`) and make the actors."""
        try:
            ray = self.ray = import_ray()
            kind = self.kind
            options = {"include_dashboard": False, **kind.init_options}
            if kind.address is not None:
                options["address"] = kind.address
            self._own_cluster = CLUSTER.join(options)
            self._node = ray.get_runtime_context().get_node_id()
            self._actor_class = ray.remote(RayActor)
            self._parts = ray.put(_pack_pipeline(self.pipeline))
            if self._auto:
                free = ray.available_resources().get("CPU", 0)
                self._fewer(max(1, int(free // kind.num_cpus_per_actor)))
            with self._lock:
                if self._closed:
                    raise RuntimeError("the ray executor was closed while it started")
                for _ in range(self.workers):
                    actor = self._new_actor()
                    self._actors.append(actor)
                    self._placed.add(actor.ready.remote())
            outcome: BaseException | None = None
        except BaseException as exc:
            outcome = exc
        # (a done future: one a caller cancelled before the shield; `close` joins this thread)
        with contextlib.suppress(InvalidStateError):
            if outcome is None:
                self._started.set_result(None)
            else:
                self._started.set_exception(outcome)

    def _fewer(self, workers: int) -> None:
        """At most `workers` actors (before any is made), each with its share of the cache."""
        if workers < self.workers:
            self.workers = workers
            self.cache_bytes = self.pipeline.chunk_cache_bytes // workers
            del self._remote[workers:], self.tally.rows[workers:]
            self._calls.fewer(workers)

    def _new_actor(self) -> Any:
        return self._actor_class.options(num_cpus=self.kind.num_cpus_per_actor).remote(
            self._parts, self.cache_bytes)

    async def _wait_started(self) -> None:
        if not self._started.done():
            self.warm_up()
            # shielded: a cancelled caller must not cancel the start every caller shares
            # (and a failed start is the callers' to raise: not logged as never retrieved)
            waiter = asyncio.wrap_future(self._started)
            waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
            await asyncio.shield(waiter)
        self._started.result()

    # -- the Executor interface -----------------------------------------------------

    def admit(self) -> AbstractAsyncContextManager[Any]:
        return self._gate or contextlib.nullcontext()

    def set_workers(self, workers: int) -> None:
        if self._gate is not None:  # (0: one task at a time; none runs in this process)
            self._gate.resize(self._limit(workers))

    def settled(self) -> bool:
        """Whether every actor has answered once."""
        if not self._started.done() or self._started.cancelled() \
                or self._started.exception() is not None:
            return False
        return self._placed.all_up()

    def reserve(self, nbytes: int) -> None:
        """Make slots hold `nbytes` before the first task."""
        self.slots.grow(nbytes)

    async def run(self, task: Task, describe: str = "") -> Result:
        """Run `task` on an actor (in a call with others while the actors are busy); if
        that actor dies, again on another; if its batch outgrew its slot, again once the
        slots have grown."""
        describe = describe or f"task {task.task_id}"
        await self._wait_started()
        if task.raws is not None:  # (views of this process's buffers do not pickle)
            self._ship(task)
        await self._placed.started()  # (at least one actor up: `Calls` sends to those)
        while True:
            self.slots.take(task)
            try:
                result = await self._calls.run(task, describe)
                if not result.needed:
                    return self.slots.receive(task, result)
                self.counts["reruns"] += 1
                self.slots.grow(result.needed)
            finally:
                self.slots.give(task)

    def _ship(self, task: Task) -> None:
        """The task's chunk bytes made bytes (once each), and counted as sent."""
        as_bytes(task)
        assert task.raws is not None
        self.counts["sent_bytes"] += sum(len(r) for r in {id(r): r for r in task.raws}
                                         .values())

    def elsewhere(self, at: int) -> bool:
        """Whether actor `at` (up) is to get its tasks' bytes from here (`read_here`)."""
        remote = self._remote[at]
        if remote is None:  # (asked once an actor is up: its first answer says its node)
            _, node = self.ray.get(self._placed.ready[at])
            remote = self._remote[at] = node != self._node
        return remote

    def read_here(self, task: Task, describe: str) -> None:
        """Read the chunks of a task for an actor that does not share this host's files."""
        if task.stash is not None or task.fill is not None:
            raise WorkerError(
                f"{describe}: an exact shuffle over chunks too large for the workers' caches "
                "keeps records pulled out of them in a file of this host, which Ray actors on "
                "other nodes cannot read; use a block shuffle, a larger memory_budget, or "
                "actors on this host")
        if task.raws is not None:  # (a bucket's: already here)
            return
        if self._files is None:
            self._files = LocalFiles()
        task.raws = self._files.read(task.refs)
        self._ship(task)

    def replace(self, at: int, dead: Any) -> None:
        """A new actor in the place of `dead` (once: its other tasks fail too)."""
        with self._lock:
            if self._closed or self._actors[at] is not dead:
                return
            self._actors[at] = self._new_actor()
            self._placed.reset(at, self._actors[at].ready.remote())
            self._remote[at] = self.kind.read_here
            self.counts["replaced"] += 1
        with contextlib.suppress(Exception):
            import_ray().kill(dead)

    def figures(self) -> dict[str, int]:
        return {**self.tally.figures(self.workers), **self.slots.figures()}

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Kill the actors (a task running is dropped: the loader is done with it) and, if
        this executor started the cluster, shut it down. In a forked child only this
        process's stash is let go: the actors are the parent's."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            start = self._start
        try:
            if self._pid == os.getpid() and start is not None:
                self._stop()  # (whatever the start came to: made, failed, or still going)
        finally:
            self.slots.close()
            self.stash.close()
            if self._files is not None:
                self._files.close()

    def _stop(self) -> None:
        if self._start is None:
            return
        self._start.join()
        if import_ray().is_initialized():
            self._kill_actors()
        if self._own_cluster:
            CLUSTER.leave()

    def _kill_actors(self) -> None:
        ray = import_ray()
        with self._lock:
            actors, self._actors, self._parts = self._actors, [], None
            self._placed.clear()
            self._calls.forget()
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)


RAY = RayExecutor()
