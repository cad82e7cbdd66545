"""Horizons of output positions over files of large chunks: what each wants of each chunk,
pulled once into the stash the workers share (`workers.extract`), and which tasks read it.

Under an exact shuffle of a file whose chunks decode to megabytes, every batch wants a few
records of every chunk, and a cache of whole decoded chunks thrashes as soon as the chunks
do not fit the cache of the process that decodes them: each worker holds its share of the
cache (`Executor.cache_bytes`), so whether they fit is asked of that share, not of the
whole (chunks that fit two workers' caches together thrash in each). Positions are then
cut into horizons of as many records as the whole decoded-chunk cache holds; per horizon,
the parent works out what it wants of each chunk (`planning.chunk_wants`, on a thread),
and sends one fill job per chunk to the pool, which pulls those records out in one
streamed pass into that chunk's region of the stash file; the horizon's tasks then read
their records there, in whichever worker. Each chunk is decoded once per horizon, by one
worker, whatever the worker count, and memory is the cache's size, shared.

One stash file serves one horizon at a time: a horizon fills it only once every task of
the one before has finished (tasks take their horizon, by their last position, in the
order they start, before they wait for anything). A task that comes later to a horizon
already gone (or a record a region had no room for) pulls its records out alone: slower,
never different. Files of small chunks, a sequential read, a block shuffle's window that
fits what a process keeps: the cache serves, and nothing here is used. A window that does
not fit is served as an exact shuffle is (its records are shuffled together: each task
wants most of its chunks).

An epoch of more records than one horizon holds would decode every chunk once per horizon
(an exact shuffle's CPU per record growing with the dataset's decoded bytes over half of
`memory_budget`), so it has a spill (`workers.spill`): a fill that first decodes a chunk
writes all its decoded records to a local file, and the chunk's later fills (later
horizons, later epochs of this loader) copy their records out of it. Where the spill is off
(no room on the disk, `spill_bytes=0`, an executor whose workers cannot open a file of this
host) or full, chunks are decoded per horizon as before. The first stash of such an epoch
says so, once a loader (a warning naming the settings, and the `horizons` and `spill_`
figures of `stats()`). An epoch is the loader's own positions of one (its shard, its
slice), not every record in the files; the spill is sized by the chunks they meet.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from typing import Any

import numpy as np

from .. import formats as fmts
from ..index.indexplan import IndexPlan
from ..index.planning import ChunkRefs, ChunkWants, chunk_wants
from ..index.sampling import Repeat
from ..workers.contexts import contextual_ids
from ..workers.extract import HEAD
from ..workers.messages import Fill, Result, Spill, StashRef, Task
from ..workers.spill import SpillFile, open_spill, region_bytes
from .stashchoice import StashChoice
from .table import INSTEAD, READS

HORIZON_FILL = 0.9  # of the cache, what a horizon's records fill (sizes vary)
PROBE = 16384  # at most this many positions at a horizon's start say if chunks thrash
NEED_BLOCK = 1 << 16  # positions looked up at a time for the chunks an epoch meets (memory)

log = logging.getLogger("aioloader")


class Horizon:
    """One horizon's readers (tasks that hold it) and its stash (`ready`: a StashRef, or
    None when the cache serves it)."""

    def __init__(self, key: tuple[int, int], before: Horizon | None) -> None:
        self.key = key  # (plan generation, number)
        self.before = before  # the horizon whose readers must be done before this fills
        self.users = 0
        self.full: set[tuple[str, int]] = set()  # chunks whose every wanted record went in
        self.idle = asyncio.Event()
        self.idle.set()
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()

    def holds(self, refs: ChunkRefs) -> bool:
        """Whether this horizon's stash holds every record of `refs` (each in a chunk
        whose wanted records all went in): its task then needs none of their bytes."""
        if refs.count is None or not len(refs) or not self.full or (refs.count <= 1).any():
            return False
        _, first = np.unique(refs.chunk_keys(), return_index=True)
        return all((refs.name(f), s) in self.full for f, s in
                   zip(refs.file[first].tolist(), refs.start[first].tolist()))

    async def drained(self) -> None:
        """Once this horizon's stash is made (or failed) and no task reads it any more."""
        await asyncio.wait([self.ready])
        while self.users:
            await self.idle.wait()


class Horizons:
    """The horizons of one task runner (`runtime.tasks.TaskRunner`): its plan, source and
    pool, and its byte path (the fill jobs read chunks as its tasks do)."""

    def __init__(self, runner: Any, spill_dir: str | None = None,
                 spill_bytes: int | None = None) -> None:
        self.runner = runner
        self._spill_at = (spill_dir, spill_bytes)
        self.spill: SpillFile | None = None  # (made once an epoch needs horizons)
        self.count = 0  # horizons whose stash was filled
        self.probed = 0  # horizons checked for thrashing
        self._gen = 0
        self._latest: Horizon | None = None
        self.choice = StashChoice(runner)  # whether the stash serves, and its share
        self._preparing: set[asyncio.Future] = set()
        self.length = 0  # output positions a horizon holds (once worked out)
        self.per_epoch = 0  # horizons an epoch needs (once a stash was filled; 0 before)

    def use(self) -> None:
        """A new plan: horizons numbered afresh (the stash still waits for the old ones)."""
        self._gen += 1

    def hold(self, at: int) -> Horizon | None:
        """The horizon of position `at`, held by one more task (`release` when done); None
        when chunks are small. Synchronous, so that tasks hold in the order they start."""
        share, mean = self.choice.share()
        if not share:
            return None
        # a task is of the horizon of its last position: the horizon's stash holds the
        # positions of the longest task before it too
        plan = self.runner.plan
        slack = plan.unit * plan.task_size_goal(1, grouped=True)
        fits = max(1, int(share * HORIZON_FILL) // (int(mean) + 16))
        length = self.length = max(fits - slack, (fits + 1) // 2)
        key = (self._gen, at // length)
        h = self._latest
        if h is None or h.key < key:
            h = self._latest = Horizon(key, h)
            fut = asyncio.ensure_future(self._prepare(h, key[1] * length, length, slack))
            fut.add_done_callback(functools.partial(_settle, h.ready))
            self._preparing.add(fut)
            fut.add_done_callback(self._preparing.discard)
        elif h.key != key:  # a task later than the horizons after its own: alone
            h = Horizon(key, None)
            h.ready.set_result(StashRef(self.runner.pool.stash.path, key[1], {}))
        h.users += 1
        h.idle.clear()
        return h

    def close(self) -> None:
        """Stop the horizons in the works (the loader closes; `close_spill` once the pool
        has stopped)."""
        for fut in list(self._preparing):
            fut.cancel()

    def close_spill(self) -> None:
        """Let the spill go: after the pool stopped, so that no job of it is left to open
        the spill's path once its number is another file's (its checks are the backstop)."""
        if self.spill is not None:
            self.spill.close()

    def release(self, h: Horizon | None) -> None:
        if h is not None:
            h.users -= 1
            if not h.users:
                h.idle.set()

    async def _prepare(self, h: Horizon, a: int, length: int, slack: int
                       ) -> StashRef | None:
        plan = self.runner.plan
        b = a + length if plan.length is None else min(a + length, plan.length)
        mean = self.choice.share()[1]
        records, _ = plan.index.lookup(np.arange(a, a + min((b - a + 1) // 2, PROBE),
                                                 dtype=np.int64))
        self.probed += 1
        head = self.runner.source.chunk_refs(records)
        if not self.choice.serves(head, mean, slack):
            return None
        if not self.per_epoch:
            await self._tell(length, mean)
        lo = max(0, a - slack)
        wants, records, refs = await asyncio.to_thread(self._wants, plan, h.key[1], lo, b)
        if h.before is not None:
            await h.before.drained()
        stash = self.runner.pool.stash
        decoded = self._decoded(wants, refs)
        offsets, sizes = stash.regions(self._estimates(wants, decoded))
        got = await asyncio.gather(*(self._fill(c, wants, records, refs, int(offsets[c]),
                                                int(sizes[c]), int(decoded[c]))
                                     for c in range(len(sizes))), return_exceptions=True)
        for g in got:
            if isinstance(g, BaseException):
                raise g
        self.count += 1
        stash.fills += 1
        wanted = np.diff(wants.offsets)
        h.full = {(wants.names[int(wants.file[c])], int(wants.start[c]))
                  for c in range(len(sizes)) if got[c] == wanted[c]}
        at = {(wants.names[int(wants.file[c])], int(wants.start[c])):
              (int(offsets[c]), int(sizes[c])) for c in range(len(sizes)) if got[c]}
        return StashRef(stash.path, h.key[1], at, serial=stash.fills)

    async def _tell(self, length: int, mean: float) -> None:
        """The horizons an epoch (this loader's positions of one: its shard, its slice)
        needs, worked out once; more than one is told (a warning: each chunk is decoded
        that many times an epoch), with the budget that makes one."""
        n = epoch_positions(self.runner.plan.index, len(self.runner.source))
        self.per_epoch = max(1, math.ceil(n / length))
        if self.per_epoch == 1:
            return
        said = await self._open_spill(n)
        share = self.runner.pool.pipeline.chunk_cache_bytes
        one = 2 * share * n / length  # memory_budget whose half holds the epoch's records
        order = self.choice.order()
        log.warning(
            "%s over large chunks: an epoch of %s records (~%.0f MB decoded) "
            "needs %d horizons of %s records (half of memory_budget, %.0f MB, holds one "
            "horizon's records). The spill of decoded records (spill_dir, spill_bytes) is "
            "%s. Without it every chunk is decoded %d times an epoch; raise memory_budget "
            "to about %.0f MB for one horizon (the shared stash takes half of it), or %s.",
            READS[order], f"{n:,}", n * mean / 1e6, self.per_epoch, f"{length:,}",
            share / 1e6, said, self.per_epoch, _round_up(one, 256 << 20) / 1e6,
            INSTEAD[order])

    async def _open_spill(self, n: int) -> str:
        """Make the spill (`self.spill`) where it can be, sized by the chunks the epoch's `n`
        positions meet (worked out on a thread); what to say of it."""
        if not getattr(self.runner.pool, "spills", False):
            return "off: the executor's workers cannot open a file of this host"
        if fmts.ARRAYRECORD not in set(self.runner.source.table.formats):
            return "off: it keeps decoded ArrayRecord chunks only"
        need = await asyncio.to_thread(self._own_need, n)
        self.spill, said = open_spill(*self._spill_at, need)
        return said

    def _own_need(self, n: int) -> int:
        """The spill's bytes for the multi-record chunks that positions [0, n) (an epoch of
        this loader: its shard, its slice) meet, not every chunk of the files."""
        table = self.runner.source.table
        indices = table.indices
        plan = self.runner.plan
        n = n if plan.length is None else min(n, plan.length)
        first = np.zeros(len(indices) + 1, dtype=np.int64)  # each file's first chunk
        np.cumsum([len(ix.chunk_records) for ix in indices], out=first[1:])
        met = np.zeros(int(first[-1]), dtype=bool)
        for a in range(0, n, NEED_BLOCK):
            records, _ = plan.index.lookup(np.arange(a, min(n, a + NEED_BLOCK),
                                                     dtype=np.int64))
            refs = table.chunk_refs(records)
            ids = refs.ids if refs.ids is not None else np.arange(len(refs.paths))
            met[first[np.asarray(ids)[refs.file]] + refs.chunk] = True
        return sum(int(region_bytes(ix.chunk_records, ix.chunk_decoded_sizes)[
            met[first[f] : first[f + 1]] & (ix.chunk_records > 1)].sum())
            for f, ix in enumerate(indices))

    def figures(self) -> dict[str, Any]:
        """For `stats()`: horizons filled, and (once known) how many an epoch needs, the
        positions each holds and the order they serve (`horizon_order`: "exact", "block" or
        "sequential"); empty when no stash was used."""
        if not self.per_epoch:
            return {}
        out: dict[str, Any] = {"horizons": self.count, "horizons_per_epoch": self.per_epoch,
                               "horizon_records": self.length,
                               "horizon_order": self.choice.order()}
        if self.spill is not None:
            out.update(self.spill.figures())
        return out

    def _wants(self, plan: Any, n: int, a: int, b: int
               ) -> tuple[ChunkWants, np.ndarray, ChunkRefs]:
        records, _ = plan.index.lookup(np.arange(a, b, dtype=np.int64))
        refs = self.runner.source.chunk_refs(records)
        return chunk_wants(refs, n), records, refs

    def _decoded(self, wants: ChunkWants, refs: ChunkRefs) -> np.ndarray:
        """Each wanted chunk's decoded bytes (the files' index says)."""
        indices = self.runner.source.table.indices
        ids = refs.ids if refs.ids is not None else np.arange(len(refs.paths))
        first = wants.first
        return np.array([indices[int(ids[f])].chunk_decoded_sizes[c] for f, c in
                         zip(refs.file[first].tolist(), refs.chunk[first].tolist())],
                        dtype=np.int64)

    def _estimates(self, wants: ChunkWants, decoded: np.ndarray) -> np.ndarray:
        """The bytes each chunk's entry should take: its records wanted at its mean size."""
        n = np.diff(wants.offsets)
        return HEAD + 8 + n * (16 + decoded / np.maximum(wants.count, 1))

    async def _fill(self, c: int, wants: ChunkWants, records: np.ndarray, refs: ChunkRefs,
                    offset: int, size: int, decoded: int) -> int:
        """Chunk c's wanted records pulled into its region by a worker (out of the spill
        when it holds them); how many fit."""
        i, spill, job = int(wants.first[c]), self.spill, None
        key = (wants.names[int(wants.file[c])], int(wants.start[c]))
        if spill is not None and refs.count is not None and (
                refs.format is None or int(refs.format[i]) == fmts.code(fmts.ARRAYRECORD)):
            job = spill.job(key, int(refs.count[i]), decoded)
        if spill is not None and job is not None and not job.write:  # nothing fetched
            result = await self._run(c, wants, records, refs.take(i, i + 1), None, offset,
                                     size, job)
            spill.outcome(key, job, result.spilled)
            if result.spilled >= 0:
                return result.count
            job = None  # (it did not check: decoded, as without a spill)
        carry = await self.runner.bytes.serve(refs.take(i, i + 1))
        try:
            result = await self._run(c, wants, records, carry.refs, carry.raws, offset, size,
                                     job)
        finally:
            carry.done()
        if spill is not None and job is not None:
            spill.outcome(key, job, result.spilled)
        self.runner.chunks_decoded += result.chunks_decoded
        return result.count

    async def _run(self, c: int, wants: ChunkWants, records: np.ndarray, refs: ChunkRefs,
                   raws: Any, offset: int, size: int, spill: Spill | None) -> Result:
        """The fill job of chunk c (refs: of its first wanted record) run by a worker."""
        runner = self.runner
        i = int(wants.first[c])
        task = Task(-1, records[i : i + 1], np.zeros(1, np.int64), refs=refs, raws=raws)
        ids = contextual_ids(refs)
        if ids:  # (a contextual format's chunk decodes by its file's context)
            task.table = runner.source.table.token
            task.contexts = runner.source.table.contexts(ids)
        task.fill = Fill(runner.pool.stash.path, offset, size,
                         wants.within[wants.offsets[c] : wants.offsets[c + 1]], spill)
        name = wants.names[int(wants.file[c])]
        return await runner.pool.run(task, describe=(
            f"pulling records of the chunk at {int(wants.start[c])} of {name} out for "
            f"horizon {wants.horizon}"))


def epoch_positions(index: IndexPlan, records: int) -> int:
    """Output positions of one epoch of a loader (of its shard, of its slice): the index's
    epoch length; where epochs do not run in even steps, what its outermost repeat repeats;
    `records`, every record in the files, where neither is known (a mix)."""
    if index.epoch_length:
        return index.epoch_length
    repeats = [i for i, op in enumerate(index.ops) if isinstance(op, Repeat)]
    per_repeat = index.lengths[repeats[-1]] if repeats else index.length
    return per_repeat or records


def _settle(ready: asyncio.Future, fut: asyncio.Future) -> None:
    """`ready` takes the outcome of the horizon's preparation (retrieved either way)."""
    if fut.cancelled():
        ready.cancel()
    elif fut.exception() is not None:
        ready.set_exception(fut.exception())  # type: ignore[arg-type]
        ready.exception()  # (seen: a loader that stops need not read it)
    else:
        ready.set_result(fut.result())


def _round_up(x: float, step: int) -> int:
    return math.ceil(x / step) * step
