"""What a started loader holds open: the executor (where tasks run), the source (and its
storage), the task runner, the run of the position's plan and the tuner — opened in the
right order, closed in the right order, by one owner — and what they start from: the
`Position` (state and plan), the settings ("auto" ones tuned as it runs) and the stats.

The workers start first (their interpreters come up while the files open); the plan is
compiled once the files are open (it needs their record count and chunk table). Closing
frees the pool's processes and shared memory, then the source's connections. When the
owner is garbage-collected without being closed, a finalizer still frees the pool.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from typing import TYPE_CHECKING, Any

from ..cache.disk import DiskCache
from ..cache.segments import MIN_SEGMENTS
from ..cache.tier import DiskTier
from ..describe.mixed import opened
from ..describe.objects import ObjectRecords, ObjectSource
from ..describe.plan import Plan, Shape, source_meta
from ..elements.bucketing import BucketOp
from ..index.blocks import unfit
from ..index.sampling import Shuffle
from ..io.storage import Storage
from ..options import LoaderOptions
from ..source import ArrayRecordSource
from ..urls import is_local
from ..workers import Executor, open_executor
from ..workers.kinds import kind_named, prepare
from ..workers.messages import Pipeline
from .autotune import Setting, available_cores
from .autotune import start as tuning_start
from .output import Run
from .position import Position
from .stats import PipelineStats
from .tasks import TaskRunner
from .tuner import Tuner

log = logging.getLogger("aioloader")

if TYPE_CHECKING:
    from ..describe.dataset import Dataset

# Slots: tasks in flight or done (prefetch: the sync iterator's hand-off counts among them,
# `Run.next`), a few the consumer holds (its step, device prefetch), and spares; beyond
# that a batch goes by value. Only slots used are memory: at most prefetch + what the
# consumer holds, reused last-in first-out (`Arena.take`).
SYNC_HANDOFF_DEPTH = 2  # batches the sync iterator's pump keeps ready (within the prefetch)
HELD_SLOTS = 4


def worker_pipeline(dataset: Dataset, sh: Shape, verify: str, max_decoded: int) -> Pipeline:
    """What every worker runs: the record ops, and in batch mode the batching and the maps
    after it (in stream mode those run where the stream is assembled)."""
    return Pipeline(
        record_ops=dataset.record_ops,
        batch=dataset.batching if sh.batch_mode else None,  # type: ignore[arg-type]
        batch_ops=dataset.batch_ops if sh.batch_mode else (),
        verify=verify,
        max_decoded=max_decoded,
        # Whole decoded chunks kept (or, under a horizon, records pulled out of them) by
        # all workers: half the memory budget (256 MiB by default), not a fixed size.
        chunk_cache_bytes=max_decoded // 2,
        # (buckets take elements, which hold no shared-memory slot while they wait, and
        # their length_fn runs where they are kept)
        stream=None if sh.batch_mode or isinstance(dataset.batching, BucketOp)
        else dataset.batching,
    )


class Parts:
    """The position, settings and stats of one loader (`owner`), and its executor, source,
    runner, run and tuner once `open` ran."""

    def __init__(self, owner: object, dataset: Dataset, options: LoaderOptions) -> None:
        self._owner = weakref.ref(owner)
        self.dataset, self.options = dataset, options
        # "auto" settings start here and are tuned while running (`runtime.tuner`): the
        # numbers to start with, and the most each may grow to (`aioloader.runtime.autotune`)
        self._cores = available_cores()
        self.setting, self.limits = tuning_start(
            options.worker.workers,
            options.prefetch.resolved(options.worker.workers, self._cores),
            options.read.io_concurrency,
            self._cores, remote=_remote(dataset),
            prefetch_given=options.prefetch.prefetch is not None)
        if self.setting.workers or "workers" in self.limits.tune:  # (auto: workers may come)
            prepare(options.worker.executor, dataset)  # e.g. the worker server starts
        self.position = Position(dataset, options)
        tuned = "workers" in self.limits.tune
        self.stats = PipelineStats(workers=self.setting.workers, prefetch=self.setting.prefetch,
                                   graph=self.position.dataset.describe(),  # sizes chosen
                                   executor=kind_named(options.worker.executor).name
                                   if self.setting.workers or tuned else "inline")
        trace = options.trace if options.trace is not None else \
            os.environ.get("AIOLOADER_TRACE") or None
        self._trace_path = trace if isinstance(trace, str) else None  # written at aclose
        if trace:
            self.stats.start_trace()
        self.pool: Executor | None = None
        self.source: ArrayRecordSource | ObjectRecords | None = None
        self.runner: TaskRunner | None = None
        self.disk: DiskTier | None = None
        self.run: Run | None = None  # from the position's state (a new one at set_state)
        self.tuner: Tuner | None = None  # "auto" settings (`runtime.tuner`)
        self._finalizer: weakref.finalize | None = None

    @property
    def shape(self) -> Shape:
        return self.position.shape

    async def open(self) -> Plan:
        """Start the workers, open the files, have the position compile the plan."""
        ds, opts = self.dataset, self.options
        spec = opened(ds.source)  # a mix's inputs: one source, end to end
        pipeline = worker_pipeline(ds, self.shape, spec.verify, opts.read.memory_budget)
        if isinstance(spec, ObjectSource):  # the workers read it (aioloader.describe.objects)
            pipeline = dataclasses.replace(pipeline, records=spec.obj)
        first, most = self.setting, self.limits
        # With workers="auto", the pool starts `most.workers` processes (all at once: a
        # worker started later could not open the pool's queues, whose names are unlinked
        # once the first ones are up, `workers.semnames`); its gate lets only the tuner's
        # count of tasks at them at once (`lanes`). Idle workers cost memory, not CPU.
        tuned = "workers" in most.tune
        self.pool = open_executor(
            pipeline, most.workers if tuned else first.workers,
            slots=most.prefetch + SYNC_HANDOFF_DEPTH + HELD_SLOTS,
            slot_size=opts.worker.slot_size, lanes=first.workers if tuned else None,
            first_in_parent=opts.worker.first_in_parent, kind=opts.worker.executor)
        owner = self._owner()
        self._finalizer = weakref.finalize(owner if owner is not None else self,
                                           self.pool.close)
        self.pool.warm_up()  # (auto at 0 too: a step up is then measured, not spawned)
        if isinstance(spec, ObjectSource):
            return self._open_object(spec, owner)
        read = opts.read
        storage = Storage(concurrency=most.io_concurrency, max_inflight_bytes=read.memory_budget,
                          retry=read.retry, storage_options=dict(spec.storage_options),
                          gcs_client=read.gcs_client)
        storage.set_concurrency(first.io_concurrency)
        src = self.source = ArrayRecordSource(
            list(spec.paths), storage=storage, verify=spec.verify,
            max_gap=read.max_gap, resident_bytes=read.resident_bytes,
            index_cache_dir=read.index_cache_dir, format=spec.format)
        self.stats.io_source = storage.stats.as_dict
        self.stats.cache_source = self._cache_figures
        await src.aopen()
        self.stats.transfer_source = self.pool.figures
        if len(src):  # slots for a batch of records of the files' mean size, at least
            stored = sum(f.size for f in src.table.files) / len(src)
            self.pool.reserve(int(stored * self.shape.unit))
        whole = src.resident is not None and src.resident.whole  # read like local files
        shuffle = next((op for op in self.position.dataset.index_ops
                        if isinstance(op, Shuffle) and op.strategy == "block"), None)
        block = shuffle.block_bytes if shuffle is not None else 0
        if block:  # a bounded tier's segments no larger than the blocks (each fetched once)
            await src.fetcher.fit_segments(block)
        if shuffle is not None and not src.all_local and not whole:
            self._check_blocks(shuffle, read.resident_bytes, src.fetcher.segment_bytes)
        plan = self.position.open(source_meta(src, spec.verify, whole=whole))
        self.stats.graph = self.position.dataset.describe()  # a resumed state's sizes
        if plan.window_bytes and not src.all_local and src.resident is None:
            log.warning(
                "block shuffle of a remote dataset with resident_bytes=%d: too small for the "
                "memory tier (it needs at least %d, %d segments), so every record is its own "
                "request; raise resident_bytes", read.resident_bytes,
                MIN_SEGMENTS * src.fetcher.segment_bytes, MIN_SEGMENTS)
        self.disk = self._disk_tier(src)
        self.runner = TaskRunner(self.position, src, self.pool, self.stats, owner=owner,
                                 disk=self.disk, spill=(read.spill_dir, read.spill_bytes))
        return plan

    def _check_blocks(self, shuffle: Shuffle, resident_bytes: int, segment: int) -> None:
        """A remote dataset larger than `resident_bytes`, block-shuffled: refuse sizes the
        user set that the memory tier cannot hold; warn of a resumed state's."""
        why = unfit(shuffle.block_bytes, shuffle.window_bytes, resident_bytes, segment) \
            if resident_bytes else None
        if why is None:
            return
        given = next(op for op in self.position.described.index_ops
                     if isinstance(op, Shuffle) and op.strategy == "block")
        if given.block_bytes or given.window_bytes:  # set by the user
            raise ValueError(why)
        log.warning("%s (these sizes are the resumed state's, kept so that it resumes "
                    "exactly)", why)

    def new_run(self) -> None:
        """A run from the position's state (the scheduler's depth: the prefetch now)."""
        assert self.runner is not None
        self.run = Run(self.runner, self.position.state, self._depth(self.stats.prefetch),
                       self.dataset, self.stats)

    def _depth(self, prefetch: int) -> int:
        """Tasks in flight for `prefetch`: as many calls to the workers as `prefetch` tasks
        alone, whatever number of tasks the executor groups into one."""
        # (optional on an executor: one written before executors could group tasks has none)
        return prefetch * (getattr(self.pool, "tasks_per_call", 1) if self.pool is not None else 1)

    def restart(self, replanned: bool) -> None:
        """A state was set (`replanned`: with another plan): the runner forgets what it looked
        up of the old plan, and a run in progress starts again from the state."""
        if replanned and self.runner is not None:
            self.runner.use()
        if self.run is not None:
            old, self.run = self.run, None
            for t in old.scheduler.cancel():
                t.add_done_callback(lambda t: t.cancelled() or t.exception())
            self.new_run()

    def start_tuner(self) -> None:
        """With "auto" settings, the tuner: what it measures, and `_tune` to apply."""
        if not self.limits.tune:
            return
        storage = getattr(self.source, "storage", None)
        pool = self.pool
        self.tuner = Tuner(self.setting, self.limits, self.stats, self._cores, self._tune,
                           io_held=getattr(storage, "slots_held_seconds", None),
                           settled=lambda: pool is None or pool.settled(),
                           reads=lambda: storage.stats.reads if storage else 0,
                           base_rtt=getattr(storage, "base_rtt", lambda: None))
        self.stats.autotune_source = self.tuner.figures
        self.tuner.start()

    def _tune(self, s: Setting) -> None:
        """Apply the tuner's setting: the executor's workers, the tasks in flight, the
        requests."""
        st, tune = self.stats, self.limits.tune
        if "workers" in tune and self.pool is not None:
            self.pool.set_workers(s.workers)  # (0: tasks run in this process)
            st.workers = s.workers
            st.process.cores = max(1, s.workers)
        if "prefetch" in tune:
            st.prefetch = s.prefetch
            if self.run is not None:
                self.run.scheduler.set_depth(self._depth(s.prefetch))
        storage = getattr(self.source, "storage", None)
        if "io_concurrency" in tune and storage is not None:
            storage.set_concurrency(s.io_concurrency)

    async def stop(self) -> list[Any]:
        """Stop the tuner and cancel the run's tasks; returns those to await before
        `aclose`."""
        if self.tuner is not None:
            await self.tuner.aclose()
        return self.run.scheduler.cancel() if self.run is not None else []

    def _open_object(self, spec: ObjectSource, owner: object) -> Plan:
        """`open` for a `from_source()` object: no files, storage or tiers to open."""
        assert self.pool is not None
        src = self.source = ObjectRecords(spec)
        self.stats.transfer_source = self.pool.figures
        plan = self.position.open(source_meta(src, spec.verify, whole=False))
        self.runner = TaskRunner(self.position, src, self.pool, self.stats, owner=owner)
        return plan

    def _disk_tier(self, src: ArrayRecordSource) -> DiskTier | None:
        """The disk tier of a remote dataset, when `cache_dir` is set: under the memory tier,
        if any, whose segment fetches go through it (read from disk when there, stored when
        not), and serving the tasks not in memory. For a dataset not kept whole in memory,
        a filler gets an eighth of `io_concurrency` (the rest stays for reads); one kept
        whole is stored by the memory tier's own fetches."""
        read = self.options.read
        if read.cache_dir is None or src.all_local:
            return None
        tier = DiskTier(DiskCache(read.cache_dir, read.cache_bytes), src.table, src.storage,
                        src.fetcher.segment_bytes)  # the memory tier's segments
        kept = src.resident
        if kept is not None:
            kept.fetch_segment = tier.fetch_into
        if kept is None or not kept.whole:
            tier.start_filler(max(1, self.setting.io_concurrency // 8))
        return tier

    def free(self) -> None:
        """Free what is this process's without the event loop (the pool's processes and
        shared memory): at interpreter exit, in a forked child, or before `aclose`."""
        if self._finalizer is not None:
            self._finalizer()

    async def aclose(self) -> None:
        if self.run is not None:
            await self.run.aclose()
        horizons = self.runner.horizons if self.runner is not None else None
        if horizons is not None:
            horizons.close()
        self.free()  # (the pool stopped first: no job of it opens the spill once it closed)
        if horizons is not None:
            horizons.close_spill()
        disk, self.disk = self.disk, None
        if disk is not None:
            await disk.aclose()
        if self.source is not None:
            await self.source.aclose()
            if self.source.storage is not None:  # (an object source has none)
                await self.source.storage.aclose()
        if self._trace_path:
            try:
                self.stats.trace(self._trace_path)
                log.info("wrote the trace to %s", self._trace_path)
            except OSError as exc:
                log.warning("the trace could not be written to %s: %s", self._trace_path, exc)

    def _cache_figures(self) -> dict[str, Any]:
        """The fetch stage's cache of raw multi-record chunks, the workers' caches of
        decoded ones, and the memory copy of a remote dataset."""
        src, runner = self.source, self.runner
        if not isinstance(src, ArrayRecordSource) or not src.opened:  # (never opens it)
            return {}
        cache, kept = src.fetcher.raw_cache, src.resident
        out = {"hits": cache.hits, "misses": cache.misses, "bytes": cache.bytes}
        if runner is not None and (runner.chunk_hits or runner.chunks_decoded):
            out.update(decoded_hits=runner.chunk_hits, decoded=runner.chunks_decoded)
        if runner is not None:  # an exact shuffle's horizons over large chunks, if any
            out.update(runner.horizons.figures())
        if kept is not None and kept.fetched:
            out.update(resident_bytes=kept.bytes, resident_segments=kept.resident)
            if not kept.whole:  # the bounded tier: what it held, fetched, evicted, served
                out.update(tier_capacity=kept.capacity, tier_fetched=kept.fetched,
                           tier_fetched_bytes=kept.fetched_bytes,
                           tier_evictions=kept.evictions, tier_records=kept.hits,
                           tier_waits=kept.waits, tier_peak_bytes=kept.peak)
        if self.disk is not None:
            out.update(self.disk.figures())
        return out


def _remote(dataset: Dataset) -> bool:
    """Whether any of the dataset's files lies in a bucket (or behind any non-local URL)."""
    spec = opened(dataset.source)
    return any(not is_local(p) for p in getattr(spec, "paths", ()))
