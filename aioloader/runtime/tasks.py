"""One task, from output positions to the workers' result: look up, fetch, run.

A task covers output positions `lo..hi-1`. Its record indices and epochs come from the plan's
index ops (`sampling`), where their chunks lie from the source's chunk table; what the task
carries for them (refs the worker reads, or bytes) from the byte path (`source.bytepath`,
which decides the tier; `readahead` tells the memory tier what comes next); the decode pool
then decodes, transforms and batches it (`workers`). This module owns that sequence and the
figures of its two stages (fetch, decode+transform); the order of tasks is the scheduler's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrayrecord import ArrayRecordFormatError
from ..describe.plan import Plan
from ..index.planning import ChunkRefs
from ..io.storage import StorageError
from ..source.bytepath import BytePath, Link
from ..workers import Executor, Result, Task
from ..workers.arena import slot_bytes
from ..workers.contexts import contextual_ids
from .horizons import Horizons
from .readahead import Readahead

if TYPE_CHECKING:
    from ..cache.tier import DiskTier
    from .position import Position

LOOKAHEAD_TASKS = 8  # tasks' worth of positions looked up at once...
LOOKAHEAD_RECORDS = 16384  # ... and no fewer positions than this, after the first lookup


class TaskRunner:
    """Runs tasks of the position's plan over one opened source, on an executor (`pool`)."""

    def __init__(self, position: Position, source: Any, pool: Executor, stats: Any,
                 owner: object = None, disk: DiskTier | None = None,
                 spill: tuple[str | None, int | None] = (None, None)) -> None:
        # The loader: its running tasks keep it alive, so that when a loop ends under an
        # `async for` left without `async with`, its LoopGuard still finds it to close.
        self.owner = owner
        self.position = position
        self.source = source
        self.pool = pool
        self.stats = stats
        self.local = source.all_local
        # where each task's bytes come from: memory tier, disk tier (`disk`), store
        self.bytes = BytePath(source, disk)
        self.batches_per_task = 1  # grows after the first batch (see `observe`)
        self._goals: dict[Link, int] | None = None  # per serving link (see `observe`)
        self._largest = 0  # bytes of the largest batch (or window) a task has returned
        self._ahead: tuple | None = None  # see _lookup
        self.chunk_hits = 0  # multi-record chunks the workers found decoded, or decoded
        self.chunks_decoded = 0
        self.stash_missed = 0  # records a horizon's stash lacked: decoded by their task
        self.readahead = Readahead(source)
        # exact shuffles over large chunks: records pulled out per horizon, shared
        self.horizons = Horizons(self, *spill)  # (`spill`: where, and its most bytes)
        table = getattr(source, "table", None)  # (files: their contexts' token)
        self._token = table.token if table is not None else ""

    @property
    def plan(self) -> Plan:
        """The plan tasks run (the position's: one holder)."""
        plan = self.position.plan
        assert plan is not None
        return plan

    def use(self) -> None:
        """The position's plan changed (a state set with another window, layout or lanes):
        what was looked up of the old one goes."""
        self._ahead = None
        self.horizons.use()
        self.readahead.use()

    def span(self, lo: int) -> tuple[int, int] | None:
        return self.plan.span(lo, self.batches_per_task)

    async def run(self, k: int, lo: int, hi: int) -> Result:
        src, st = self.source, self.stats
        records, epochs, refs = self._lookup(lo, hi)
        self.bytes.advise(functools.partial(self.readahead.at, lo, self.plan))
        carry = None
        # by its last position (the horizon takes the positions of a task before it), held
        # before anything is awaited: tasks hold horizons in the order they start
        horizon = self.horizons.hold(hi - 1)
        try:
            # local files: nothing is fetched here (the workers read them), unless records
            # are pulled out of large chunks for an exact shuffle (the horizon)
            fetching = not self.local or horizon is not None
            with st.fetch.timed(items=hi - lo) if fetching else contextlib.nullcontext():
                stash = None if horizon is None else await asyncio.shield(horizon.ready)
                # (every record in the stash: no bytes to fetch, read or ship)
                held = stash is not None and horizon is not None and horizon.holds(refs)
                carry = await self.bytes.serve(refs, stashed=held)
                task = Task(k, records, epochs, refs=carry.refs, raws=carry.raws,
                            table=self._token)
                task.stash = stash
            async with self.pool.admit():
                with st.process.timed(items=hi - lo):
                    result = await self._run(task, f"task {k} (output positions "
                                                   f"{lo}..{hi - 1})")
        except (ArrayRecordFormatError, StorageError) as err:
            # A file rewritten under us shows up as corrupt bytes or short reads: say so.
            raise await src.explain(err, set(src.locate(records)[0].tolist())) from None
        finally:
            self.horizons.release(horizon)
            if carry is not None:  # the workers are done with the task's segments
                carry.done()
        if result.reads and carry.link.own_files:  # the worker's reads of local files (not
            st.add_worker_reads(result.reads, result.bytes_read)  # of a remote one's copy)
        st.records += hi - lo
        st.elements += result.count
        st.task_seconds += max(0, result.ended_ns - result.began_ns) / 1e9
        st.add_ops(self.plan.op_names, result.op_items, result.op_seconds)
        if st.tracer is not None:
            st.tracer.task(result, self.plan.op_names, k)
        self.chunk_hits += result.chunk_hits
        self.chunks_decoded += result.chunks_decoded
        self.stash_missed += result.stash_missed
        return result

    async def _run(self, task: Task, describe: str) -> Result:
        """`task` run by the pool; if the worker lacked some of its files' contexts, once
        more with the contexts of all its contextual files (`workers.contexts`: a worker is
        given each file's once), as the pool may give it to another worker, which lacks
        others."""
        raws = task.raws
        result = await self.pool.run(task, describe=describe)
        if result.missing:
            task.contexts = self.source.table.contexts(contextual_ids(task.refs))
            task.raws, task.raw_spans = raws, None
            result = await self.pool.run(task, describe=describe)
            if result.missing:
                raise RuntimeError(f"{describe}: a worker lacks the contexts it was given")
        return result

    def _lookup(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, ChunkRefs]:
        """Record indices, epochs and chunk refs of output positions `lo..hi-1`.

        Computed for LOOKAHEAD_TASKS tasks at a time, and at least LOOKAHEAD_RECORDS
        positions once the first batch is under way: the permutation and the chunk table
        are vectorized, and most of their cost on one batch is per call (a cycle-walking
        permutation's passes), not per record. Tasks start in order, so the window is hit;
        a miss only recomputes (pure).
        """
        plan, w = self.plan, self._ahead
        if w is None or not (w[0] <= lo and hi <= w[1]):
            span = plan.unit * self.batches_per_task * LOOKAHEAD_TASKS
            stop = lo + (span if w is None else max(span, LOOKAHEAD_RECORDS))
            if plan.length is not None:
                stop = min(stop, plan.length)
            stop = max(stop, hi)
            records, epochs = plan.index.lookup(np.arange(lo, stop, dtype=np.int64))
            w = self._ahead = (lo, stop, records, epochs, self.source.chunk_refs(records))
        a, b = lo - w[0], hi - w[0]
        return w[2][a:b], w[3][a:b], w[4].take(a, b)

    def observe(self, batches: list | None, largest: int = -1) -> None:
        """After a result: tasks double in size per result up to the plan's goal, rather
        than jump to it (a consumer that has had one batch would otherwise wait for a whole
        large task, one worker a few times the step, before its second). While the bounded
        memory tier serves the tasks of a remote dataset (dense reads: a block shuffle, a
        sequential read), they group batches like local files: the workers read the bytes
        themselves, and four times fewer tasks cost the parent four times fewer lookups,
        pins and hops; once a task is not served (sparse reads), they shrink back. Tasks
        whose records a horizon's stash holds carry no bytes: they grow as local ones do.
        `largest`: the largest batch's `slot_bytes`, as its worker measured it (-1: measured
        here)."""
        if not batches:
            return
        if largest < 0:
            largest = max(slot_bytes(b) for b in batches)
        if self._goals is None or largest > self._largest:  # each link's goal, from the
            self._largest = largest  # largest batch so far: a task must fit its slot
            self._goals = {link: link.goal(self.plan, largest)
                           for link in (self.bytes.stashed, *self.bytes.links)}
        goal = self._goals[self.bytes.serving()]
        self.batches_per_task = min(goal, 2 * self.batches_per_task)
        self.stats.batches_per_task = self.batches_per_task

