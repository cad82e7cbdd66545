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
import contextlib
import dataclasses
from typing import Any

import numpy as np

from ..arrayrecord import ArrayRecordFormatError
from ..gate import Gate
from ..plan import Plan
from ..planning import ChunkRefs, ChunkWants, chunk_wants
from ..storage import StorageError
from ..workers import Pool, Result, Task
from ..workers.arena import array_leaves
from .readahead import Readahead

LOOKAHEAD_TASKS = 8  # tasks' worth of positions looked up at once
HORIZON_FILL = 0.9  # of a worker's cache share, what a horizon's records fill (sizes vary)
PROBE = 16384  # at most this many positions at a horizon's start say if chunks thrash
LARGE_CHUNK = 1 << 20  # mean decoded bytes a chunk from which horizons are worked out
_OPEN = contextlib.nullcontext()  # no worker gate (an async context manager too)


def gate_limit(lanes: int, workers: int) -> int:
    """Tasks let at the pool for `lanes` busy workers of the `workers` started: `lanes` while
    some are to stay idle; with all of them in use, one more each, queued behind the task
    it runs, as without a gate (a worker that waits for its next task from this process
    idles for the round trip: ~10% of an epoch of 1 KiB JSON records at 2 workers)."""
    if lanes < 1:  # one lane, a thread of this process
        return 1
    return lanes if lanes < workers else lanes + workers


class TaskRunner:
    """Runs tasks of one plan over one opened source and pool."""

    def __init__(self, plan: Plan, source: Any, pool: Pool, stats: Any,
                 owner: object = None) -> None:
        # The loader: its running tasks keep it alive, so that when a loop ends under an
        # `async for` left without `async with`, its LoopGuard still finds it to close.
        self.owner = owner
        self.plan = plan
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
        self.readahead = Readahead(plan, source)
        self._horizon: tuple[int, asyncio.Future] | None = None  # see _wants
        self.horizons = 0  # horizons whose wants were worked out (the large-chunk path)
        # workers="auto": tasks at the workers at once (resized by the tuner); None: no gate
        self.worker_gate: Gate | None = None

    def use(self, plan: Plan) -> None:
        """Run tasks of `plan` from now on (the same pipeline with another window)."""
        self.plan, self._ahead, self._horizon = plan, None, None
        self.readahead.use(plan)

    def span(self, lo: int) -> tuple[int, int] | None:
        return self.plan.span(lo, self.batches_per_task)

    async def run(self, k: int, lo: int, hi: int) -> Result:
        src, st = self.source, self.stats
        records, epochs, refs = self._lookup(lo, hi)
        if not self.local and not (self.disk is not None and self.disk.complete()):
            self.readahead.at(lo)  # (the memory tier's: needless once all is on disk)
        lease = None
        try:
            with st.fetch.timed(items=hi - lo):
                task, lease = await self._build(k, records, epochs, refs)
                # by its last position: a task across a horizon's end is the next one's
                # first (the next horizon wants the rest of it; its own records are added)
                task.wants = await self._wants(hi - 1)
            async with self.worker_gate or _OPEN:
                with st.process.timed(items=hi - lo):
                    result = await self.pool.run(task, describe=f"task {k} (output positions "
                                                                f"{lo}..{hi - 1})")
        except (ArrayRecordFormatError, StorageError) as err:
            # A file rewritten under us shows up as corrupt bytes or short reads: say so.
            raise await src.explain(err, set(src.locate(records)[0].tolist())) from None
        finally:
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

    async def _wants(self, at: int) -> ChunkWants | None:
        """What the horizon of position `at` wants of each large chunk, when the chunks its
        first half (at most `PROBE` positions) touches, decoded whole, would not fit a
        worker's share of the decoded-chunk cache (an exact shuffle over a file of large
        groups: every batch wants every chunk); None otherwise (the cache serves: few
        chunks, or a block shuffle's window, or a sequential read). A horizon is as many
        positions as the share holds records of the files' mean decoded size
        (`workers.extract.Stash`). Worked out once per horizon, on a thread (a few hundred
        ms for 250k positions), shared by the tasks that want it."""
        share, mean = self._share()
        if not share:
            return None
        length = max(1, int(share * HORIZON_FILL) // (int(mean) + 16))
        n = at // length
        h = self._horizon
        if h is None or h[0] != n:
            plan, a = self.plan, n * length
            b = a + length if plan.length is None else min(a + length, plan.length)
            records, _ = plan.index.lookup(np.arange(a, a + min((b - a + 1) // 2, PROBE),
                                                     dtype=np.int64))
            fut = asyncio.get_running_loop().create_future()
            if thrashes(self.source.chunk_refs(records), share, mean):
                fut = asyncio.ensure_future(asyncio.to_thread(self._horizon_wants, plan, n,
                                                              a, b))
            else:
                fut.set_result(None)
            h = self._horizon = (n, fut)
        return await asyncio.shield(h[1])

    def _horizon_wants(self, plan: Plan, n: int, a: int, b: int) -> ChunkWants:
        records, _ = plan.index.lookup(np.arange(a, b, dtype=np.int64))
        wants = chunk_wants(self.source.chunk_refs(records), n)
        self.horizons += 1
        return wants

    def _share(self) -> tuple[int, float]:
        """A worker's share of the decoded-chunk cache, and the files' mean decoded record
        size; (0, 0) when chunks are small (under `LARGE_CHUNK` decoded on average: each
        task decodes its own, as before) or hold one record, or there are no files
        (from_source)."""
        got = getattr(self, "_share_mean", None)
        if got is None:
            table = getattr(self.source, "table", None)
            got = (0, 0.0)
            if table is not None and table.max_group_size > 1 and len(self.source):
                decoded = sum(int(ix.chunk_decoded_sizes.sum()) for ix in table.indices)
                share = self.pool.pipeline.chunk_cache_bytes // max(1, self.pool.workers)
                if decoded >= LARGE_CHUNK * max(1, table.chunk_count):
                    got = (share, decoded / len(self.source))
            self._share_mean = got
        return got

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


def thrashes(head: ChunkRefs, share: int, mean: float) -> bool:
    """Whether the multi-record chunks the records `head` touch would, decoded whole, take
    more than `share` bytes (records of `mean` decoded bytes)."""
    if head.count is None or not len(head):
        return False
    multi = head.count > 1
    key = head.file[multi] * (1 << 44) + head.start[multi]
    _, first = np.unique(key, return_index=True)
    return float(head.count[multi][first].sum()) * mean > share
