"""One task, from output positions to the workers' result: look up, fetch, run.

A task covers output positions `lo..hi-1`. Its record indices and epochs come from the plan's
index ops (`sampling`), where their chunks lie from the source's chunk table; remote bytes
come through the source's fetch stage (merged range reads), local files and the memory tier
of a remote dataset the worker reads itself (the task's segments pinned until it is done;
`readahead` tells the tier what comes next); the decode pool then decodes,
transforms and batches it (`workers`). This module owns that sequence and the figures of
its two stages (fetch, decode+transform); the order of tasks is the scheduler's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrayrecord import ArrayRecordFormatError
from ..plan import Plan
from ..planning import ChunkRefs
from ..storage import StorageError
from ..workers import Executor, Result, Task
from ..workers.arena import array_leaves
from .horizons import Horizons
from .readahead import Readahead

if TYPE_CHECKING:
    from .statekeeping import Position

LOOKAHEAD_TASKS = 8  # tasks' worth of positions looked up at once


class TaskRunner:
    """Runs tasks of the position's plan over one opened source, on an executor (`pool`)."""

    def __init__(self, position: Position, source: Any, pool: Executor, stats: Any,
                 owner: object = None) -> None:
        # The loader: its running tasks keep it alive, so that when a loop ends under an
        # `async for` left without `async with`, its LoopGuard still finds it to close.
        self.owner = owner
        self.position = position
        self.source = source
        self.pool = pool
        self.stats = stats
        self.local = source.all_local
        self.batches_per_task = 1  # grows after the first batch (see `observe`)
        self._goal: int | None = None
        self._disk_goal = 1  # the goal once every segment is in the disk tier
        self._tier_goal = 1  # the goal while the memory tier serves tasks (see `observe`)
        self._from_tier = False  # the last task built was served by the memory tier
        self._ahead: tuple | None = None  # see _lookup
        self.disk: Any = None  # the disk tier of a remote dataset (aioloader.cache), if any
        self.chunk_hits = 0  # multi-record chunks the workers found decoded, or decoded
        self.chunks_decoded = 0
        self.readahead = Readahead(source)
        # exact shuffles over large chunks: records pulled out per horizon, shared
        self.horizons = Horizons(self)

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
        if not self.local and not (self.disk is not None and self.disk.complete()):
            self.readahead.at(lo, self.plan)  # (the memory tier's: needless once all is on disk)
        lease = None
        # by its last position (the horizon takes the positions of a task before it), held
        # before anything is awaited: tasks hold horizons in the order they start
        horizon = self.horizons.hold(hi - 1)
        try:
            with st.fetch.timed(items=hi - lo):
                task, lease = await self._build(k, records, epochs, refs)
                if horizon is not None:
                    task.stash = await asyncio.shield(horizon.ready)
            async with self.pool.admit():
                with st.process.timed(items=hi - lo):
                    result = await self.pool.run(task, describe=f"task {k} (output positions "
                                                                f"{lo}..{hi - 1})")
        except (ArrayRecordFormatError, StorageError) as err:
            # A file rewritten under us shows up as corrupt bytes or short reads: say so.
            raise await src.explain(err, set(src.locate(records)[0].tolist())) from None
        finally:
            self.horizons.release(horizon)
            if lease is not None:  # the workers are done with the task's segments
                lease.release()
        if result.reads and self.local:  # the worker's reads of local files (not of a
            st.add_worker_reads(result.reads, result.bytes_read)  # remote dataset's copy)
        st.records += hi - lo
        st.elements += result.count
        st.task_seconds += max(0, result.ended_ns - result.began_ns) / 1e9
        st.add_ops(self.plan.op_names, result.op_items, result.op_seconds)
        if st.tracer is not None:
            st.tracer.task(result, self.plan.op_names, k)
        self.chunk_hits += result.chunk_hits
        self.chunks_decoded += result.chunks_decoded
        return result

    def _lookup(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, ChunkRefs]:
        """Record indices, epochs and chunk refs of output positions `lo..hi-1`.

        Computed for LOOKAHEAD_TASKS tasks at a time: the permutation and the chunk table
        are vectorized, and most of their cost on one batch is per call, not per record.
        Tasks start in order, so the window is hit; a miss only recomputes (pure).
        """
        plan, w = self.plan, self._ahead
        if w is None or not (w[0] <= lo and hi <= w[1]):
            stop = lo + plan.unit * self.batches_per_task * LOOKAHEAD_TASKS
            if plan.length is not None:
                stop = min(stop, plan.length)
            stop = max(stop, hi)
            records, epochs = plan.index.lookup(np.arange(lo, stop, dtype=np.int64))
            w = self._ahead = (lo, stop, records, epochs, self.source.chunk_refs(records))
        a, b = lo - w[0], hi - w[0]
        return w[2][a:b], w[3][a:b], w[4].take(a, b)

    async def _build(self, k: int, records: np.ndarray, epochs: np.ndarray,
                     refs: ChunkRefs) -> tuple[Task, Any]:
        """What task `k` needs: where its records' chunks are (the worker reads local files,
        and the memory tier of a remote dataset, itself), plus the fetched bytes of remote
        files; and the lease on the memory tier's segments to release once it is done."""
        if self.local:
            return Task(k, records, epochs, refs=refs), None
        lease = await self.source.resident_refs(refs)  # in the memory tier
        self._from_tier = lease is not None
        if lease is not None:
            return Task(k, records, epochs, refs=lease.refs), lease
        if self.disk is not None:  # workers read segments on disk; the rest as bytes
            on_disk = await self.disk.local_refs(refs)
            if on_disk is not None:
                return Task(k, records, epochs, refs=on_disk), None
            raws = await self.disk.fetch_refs(refs, self.source.fetch_refs)
            return Task(k, records, epochs, refs=refs, raws=raws), None
        raws = await self.source.fetch_refs(refs)
        return Task(k, records, epochs, refs=refs, raws=raws), None

    def _goal_in_tier(self, nbytes: int) -> int:
        """Batches per task while the bounded memory tier serves them: as for local files,
        within the stored bytes a task may pin there (`SegmentStore.task_bytes`)."""
        store = getattr(self.source, "resident", None)
        if store is None or store.whole or not len(self.source):
            return 1
        stored = sum(f.size for f in self.source.table.files) / len(self.source)
        fits = int(store.task_bytes // max(1.0, stored * self.plan.unit))
        grouped = dataclasses.replace(self.plan, groups_batches=True)
        return max(1, min(fits, grouped.task_size_goal(nbytes)))

    def observe(self, batches: list | None) -> None:
        """After a result: tasks double in size per result up to the plan's goal, rather
        than jump to it (a consumer that has had one batch would otherwise wait for a whole
        large task, one worker a few times the step, before its second). While the bounded
        memory tier serves the tasks of a remote dataset (dense reads: a block shuffle, a
        sequential read), they group batches like local files: the workers read the bytes
        themselves, and four times fewer tasks cost the parent four times fewer lookups,
        pins and hops; once a task is not served (sparse reads), they shrink back."""
        if not batches:
            return
        if self._goal is None:
            nbytes = sum(a.nbytes for a in array_leaves(batches[0]))
            self._goal = self.plan.task_size_goal(nbytes)
            self._disk_goal = self.plan.task_size_goal(nbytes, grouped=True)
            self._tier_goal = self._goal_in_tier(nbytes)
        goal = self._tier_goal if self._from_tier else self._goal
        if self.disk is not None and self.disk.complete():
            goal = self._disk_goal  # records all on disk are read by workers, like local
        self.batches_per_task = min(goal, 2 * self.batches_per_task)
        self.stats.batches_per_task = self.batches_per_task

