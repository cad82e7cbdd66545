"""compile(dataset, source, options) → an immutable `Plan`: what the runtime will do (pure).

Everything the runtime decides from the description, the opened files and the options is
decided here, once, as data, so that it can be read and unit-tested without files, event
loops or processes: the index ops with the per-process shard resolved, the mode, the task
unit and how tasks grow, what the workers run, and the pipeline's fingerprint (saved in
states). The runtime then only executes a plan.

Modes. *Batch mode* (`batch()` and no filter or flat_map): a task is one or more whole
batches and the workers return finished batches. *Stream mode* (filter, flat_map or pack, or
no batching): a task is a
window of `unit` output positions, the workers return what survived, and the batches (or
packed rows) are assembled in order from consecutive windows (`runtime.assembly`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..arrayrecord.chunk import DEFAULT_VERIFY
from ..elements.transforms import BatchOp, MapOp, RecordOp, one_to_many
from ..errors import StateError
from ..index import lanes
from ..index.indexplan import IndexPlan
from ..index.sampling import BlockShuffle, Shard, Shuffle, Windows
from ..options import DEFAULT_WINDOW
from .blocksizes import sized
from .dataset import Dataset
from .description import JaxProcessShard
from .mixed import MixSpec, build_index
from .objects import ObjectRecords

if TYPE_CHECKING:
    from ..options import LoaderOptions
    from .state import LoaderState

TASK_RECORDS = 2048  # small batches are grouped into tasks of about this many records...
MAX_BATCHES_PER_TASK = 8  # ... but no more batches than this...
SLOT_SHARE = 2  # ... and filling at most 1/SLOT_SHARE of a slot: a batch up to twice the
# largest seen so far still fits, so a task does not outgrow its slot and run again


@dataclass(frozen=True)
class Shape:
    """What is known of a pipeline before its files are opened (enough to check a state)."""

    batch_mode: bool
    unit: int  # batch size (batch mode) or window (stream mode)
    drop_remainder: bool  # batch mode: a last partial batch is dropped
    fingerprint: tuple[str, ...]
    procs: tuple[int, int] | None  # (process index, count) with shard_by_jax_process()

    @property
    def process_count(self) -> int:
        return self.procs[1] if self.procs else 1


def shape(dataset: Dataset, window: int | None = None,
          procs: tuple[int, int] | None = None) -> Shape:
    """The mode, unit and fingerprint of `dataset`; `procs` resolves shard_by_jax_process()."""
    batching = dataset.batching
    batch_mode = isinstance(batching, BatchOp) and not one_to_many(dataset.record_ops)
    default = batching.size if isinstance(batching, BatchOp) else DEFAULT_WINDOW
    unit = default if batch_mode else int(window or default)
    if not needs_processes(dataset):
        procs = None
    drop = bool(batch_mode and batching.drop_remainder)  # type: ignore[union-attr]
    return Shape(batch_mode, unit, drop, fingerprint(dataset, procs), procs)


def needs_processes(dataset: Dataset) -> bool:
    """Whether the pipeline shards by JAX process (the runtime then asks jax who it is)."""
    return any(isinstance(op, JaxProcessShard) for op in dataset.index_ops)


def fingerprint(dataset: Dataset, procs: tuple[int, int] | None) -> tuple[str, ...]:
    """The pipeline as text (URLs redacted: it is saved in checkpoints); with process
    sharding, the global batch instead of the local."""
    lines = dataset.describe()
    b = dataset.batching
    if procs and isinstance(b, BatchOp):
        size = b.size * procs[1]  # (saved states name it so: without padding, as it was)
        line = f"batch(global {size})" if b.rules is None else b.describe(f"global {size}")
        lines = [line if ln == b.describe() else ln for ln in lines]
    return tuple(lines)


@dataclass(frozen=True)
class SourceMeta:
    """What the plan needs of the opened files."""

    num_records: int
    chunk_starts: np.ndarray | None  # first record of each chunk (informational)
    local: bool  # every file is on a local disk
    resident: bool  # a remote dataset kept in memory (read like local files)
    verify: str = DEFAULT_VERIFY
    # block_bytes → (first record of each block, plus the total; decoded bytes of each
    # block): the files cut into runs of whole chunks of about block_bytes on disk
    # (`RecordTable.runs`), for block shuffle; windows count decoded bytes (memory held)
    blocks: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None
    # records of each pattern (object) opened, in order: a mix's inputs are runs of them
    part_records: tuple[int, ...] = ()


@dataclass(frozen=True)
class ResolvedIndex:
    """The index ops as they run, and what the block shuffle among them decided."""

    ops: list
    block_starts: np.ndarray | None = None  # the blocks' record starts (block shuffle)
    window_bytes: int | None = None  # about how much of the data one process's window spans


def window_records(window_bytes: int, num_records: int, data_bytes: int, group: int) -> int:
    """Records in a dealt block-shuffle window: about `window_bytes` of the files' records
    at their mean size, rounded to a multiple of the global batch `group` (at least one)."""
    mean = data_bytes / num_records if num_records and data_bytes else 1.0
    return max(group, round(window_bytes / mean / group) * group)


def resolve_index_ops(ops: tuple, procs: tuple[int, int] | None, block: int,
                      meta: SourceMeta | None = None,
                      layout: tuple[tuple[int, int], ...] = (),
                      lane: lanes.Lanes | None = None) -> ResolvedIndex:
    """Index ops as they run: `shard_by_jax_process()` turned into a block-dealt `Shard`
    (whole per-process batches dealt round-robin: the global batch is the same for any
    process count), and a block `Shuffle` resolved against the files' blocks (`meta`).

    Alone, a block shuffle is `BlockShuffle` with windows of about `window_bytes` of blocks
    (at least one block). Sharded by process, it is the blocks' order, then `Windows`
    of about `window_bytes` (a multiple of the global batch) just before the process shard,
    one lane per process (`layout`: earlier process counts of the run, from the resumed
    state), so that each process reads its own ~1/P of every window instead of a slice of
    all of it. `lane`: this process's lanes after an elastic stream-mode move, in place of
    its shard (`aioloader.index.lanes`).
    """
    shuffle = next((op for op in ops if isinstance(op, Shuffle) and op.strategy == "block"),
                   None)
    dealt = shuffle is not None and procs is not None and any(
        isinstance(op, JaxProcessShard) for op in ops)
    out: list = []
    starts, window, total = None, None, 0
    for op in ops:
        if op is shuffle:
            if meta is None or meta.blocks is None:
                raise ValueError("a block shuffle needs the opened files' block table")
            starts, sizes = meta.blocks(shuffle.block_bytes)
            total = int(sizes.sum())
            out.append(BlockShuffle(shuffle.seed, 0 if dealt else shuffle.window_bytes, sizes))
            window = min(max(shuffle.window_bytes, int(sizes.max(initial=0))), total)
        elif isinstance(op, JaxProcessShard) and procs is not None:
            if dealt:
                assert shuffle is not None and meta is not None
                group = block * procs[1]
                size = window_records(shuffle.window_bytes, meta.num_records, total, group)
                out.append(Windows(shuffle.seed, size, group, procs[1], layout))
                mean = total / meta.num_records if meta.num_records else 0
                window = int(size * mean / procs[1])
            out.append(lane if lane is not None else
                       Shard(procs[0], procs[1], drop_remainder=op.drop_remainder,
                             block=block))
        else:
            out.append(op)
    return ResolvedIndex(out, starts, window)


@dataclass(frozen=True)
class Plan:
    """An immutable description of one run (see the module docstring)."""

    shape: Shape
    index: IndexPlan
    unit: int  # the shape's, or a resumed stream-mode state's window
    record_ops: tuple[RecordOp, ...]  # what every worker runs on records...
    batch_ops: tuple[MapOp, ...]  # ... and on batches (batch mode: they batch there)
    groups_batches: bool  # small batches may share a task (local or kept in memory)
    slot_size: int
    meta: SourceMeta | None = None  # the opened files, to re-resolve the index ops
    layout: tuple[tuple[int, int], ...] = ()  # earlier process counts (`LoaderState.layout`)
    window_bytes: int | None = None  # block shuffle: decoded bytes of one process's window
    lane: lanes.Lanes | None = None  # after an elastic stream-mode move (`aioloader.index.lanes`)

    @property
    def batch_mode(self) -> bool:
        return self.shape.batch_mode

    @property
    def length(self) -> int | None:
        return self.index.length

    @property
    def restarts(self) -> list[tuple[int, int, int]]:
        """`(position, skip, rows)` where a leftover lane begins (`lanes.Lanes`)."""
        if self.lane is None:
            return []
        return sorted((p, s, r) for p, (s, r) in self.lane.restarts().items())

    @property
    def cuts(self) -> list[int]:
        """Where windows restart their count besides 0 (`lanes.origin`): where
        leftovers and the process's own lane begin."""
        return [] if self.lane is None else self.lane.origins()

    @property
    def op_names(self) -> list[str]:
        """The workers' transforms as the stats table names them (`Result.op_seconds`)."""
        return ([op.describe() for op in self.record_ops]
                + [op.describe() + " [per batch]" for op in self.batch_ops])

    def span(self, lo: int, batches_per_task: int = 1) -> tuple[int, int] | None:
        """Output positions `[lo, hi)` of the task starting at `lo`; None past the end.

        A task covers `batches_per_task` whole batches (the last one may be partial, unless
        drop_remainder), or in stream mode as many windows.
        """
        unit = self.unit
        hi = lo + unit * batches_per_task
        cuts = self.cuts
        if cuts:  # windows of a region start at its origin; a task stays in one region
            start = lanes.origin(lo, cuts)
            hi = min([start + ((lo - start) // unit + batches_per_task) * unit,
                      *(c for c in cuts if c > lo)])
        length = self.length
        if length is not None:
            if lo >= length:
                return None
            hi = min(hi, length)
            if self.shape.drop_remainder:
                hi = lo + (hi - lo) // unit * unit
                if hi == lo:
                    return None
        return lo, hi

    def batches_from(self, position: int, length: int | None = None) -> int | None:
        """Batches a batch-mode run starting at `position` yields (None if endless)."""
        length = self.length if length is None else length
        if length is None:
            return None
        left = max(0, length - position)
        return left // self.unit if self.shape.drop_remainder else -(-left // self.unit)

    def task_size_goal(self, batch_nbytes: int, *, grouped: bool = False) -> int:
        """How many batches (stream mode: windows) a task should grow to, once the size of
        one is known.

        Small batches from local files (or a remote dataset kept in memory) go several to a
        task, so the per-task cost of scheduling and the process hop amortizes, as long as
        they fit a slot. Read record by record from a bucket, the reads dominate, and bigger
        tasks would only queue more reads behind io_concurrency. `batch_nbytes` is the
        largest batch seen so far; the task fills a share of its slot (SLOT_SHARE), since
        later batches may be larger (a rerun costs the whole task). A window's outputs are cut
        by the parent whatever the task size, so windows group up to TASK_RECORDS.
        `grouped`: as if local (a remote dataset's records the disk tier holds).
        """
        if not (self.groups_batches or grouped):
            return 1
        most = MAX_BATCHES_PER_TASK if self.batch_mode else TASK_RECORDS
        return max(1, min(most, TASK_RECORDS // self.unit,
                          self.slot_size // SLOT_SHARE // (batch_nbytes + 4096)))


class Opened(Protocol):
    """What `source_meta` reads of opened ArrayRecord files (`source.ArrayRecordSource`)."""

    def __len__(self) -> int: ...
    @property
    def chunk_starts(self) -> np.ndarray: ...
    @property
    def all_local(self) -> bool: ...
    @property
    def table(self) -> Any: ...  # `source.RecordTable`: its blocks and pattern_records


def source_meta(src: Opened | ObjectRecords, verify: str, *,
                whole: bool) -> SourceMeta:
    """What the plan needs of opened files (`whole`: a remote dataset kept in memory); of a
    `from_source()` object, its length (read where it is decoded, like local files)."""
    if isinstance(src, ObjectRecords):
        parts = getattr(src.obj, "part_lengths", (len(src),))
        return SourceMeta(len(src), None, True, False, verify, part_records=tuple(parts))
    return SourceMeta(len(src), src.chunk_starts, src.all_local, whole, verify,
                      src.table.blocks, src.table.pattern_records)


def compile(dataset: Dataset, meta: SourceMeta, options: LoaderOptions, *,
            unit: int | None = None, procs: tuple[int, int] | None = None,
            layout: tuple[tuple[int, int], ...] = (), state: LoaderState | None = None
            ) -> Plan:
    """The plan for `dataset` over the opened files `meta` (`unit`, `layout`, `state`: a
    resumed state's; its lanes, after an elastic stream-mode move). A block shuffle's unset
    sizes come from `options`' budgets (`blocksizes`)."""
    dataset = sized(dataset, options.read.resident_bytes, options.read.memory_budget)
    sh = shape(dataset, options.worker.window, procs)
    lane = stream_lane(dataset, meta, sh, state) if state is not None else None
    resolved = _resolve(dataset, meta, sh.procs, layout, lane)
    base = (build_index(dataset.source, meta.part_records)
            if isinstance(dataset.source, MixSpec) else None)
    index = IndexPlan(meta.num_records, resolved.ops, resolved.block_starts, base)
    return Plan(sh, index, unit or sh.unit, dataset.record_ops,
                dataset.batch_ops if sh.batch_mode else (), meta.local or meta.resident,
                options.worker.slot_size, meta, tuple(layout), resolved.window_bytes, lane)


def _block(dataset: Dataset) -> int:
    return dataset.batching.size if isinstance(dataset.batching, BatchOp) else 1


def _resolve(dataset: Dataset, meta: SourceMeta | None, procs: tuple[int, int] | None,
             layout: tuple[tuple[int, int], ...], lane: lanes.Lanes | None = None
             ) -> ResolvedIndex:
    return resolve_index_ops(dataset.index_ops, procs, _block(dataset), meta, layout, lane)


def stream_lane(dataset: Dataset, meta: SourceMeta, sh: Shape, state: LoaderState
                ) -> lanes.Lanes | None:
    """This process's lanes after an elastic stream-mode move (None: its own shard)."""
    if state.lane is None:
        return None
    assert sh.procs is not None, "only a pipeline sharded by process moves"
    if any(isinstance(op, Shuffle) and op.strategy == "block" for op in dataset.index_ops):
        raise StateError("a block shuffle with filter, flat_map or pack cannot move to "
                         "another process count (its windows are dealt by the count)")
    shard = next(op for op in dataset.index_ops if isinstance(op, JaxProcessShard))
    before = dataset.index_ops[: dataset.index_ops.index(shard)]
    parent_len = IndexPlan(meta.num_records, resolve_index_ops(before, None, 1, meta).ops,
                           None).length
    per_batch = _block(dataset) * sh.process_count if isinstance(dataset.batching, BatchOp) \
        else None  # the global batch: shards are dealt in its per-process share

    def block(count: int) -> int:
        if per_batch is None:
            return 1
        if per_batch % count:
            raise StateError(f"a state of {count} processes cannot move here: the global "
                             f"batch {per_batch} does not split into {count}")
        return per_batch // count

    def resolve(obj: Any, count: int, index: int) -> lanes.Lanes | Shard:
        """Lane `index` of a run on `count` processes; one moved there is made now
        (`remap`)."""
        if "moved" not in obj:
            lane = lanes.from_json(obj)
            lanes.check(lane, index, count, block(count), parent_len)
            return lane
        if obj["index"] != index:
            raise StateError(f"loader state lane was made for process {obj['index']}, not "
                             f"{index} of {count}")
        origin, old = obj["moved"], obj["moved"]["process_count"]
        progress = []
        for p, d in enumerate(origin["lanes"]):
            lane = (resolve(d["lane"], old, p) if d.get("lane") is not None else
                    Shard(p, old, drop_remainder=shard.drop_remainder, block=block(old)))
            progress.append(lanes.Progress(lane, d["position"], d["skip"], d["rows"],
                                           d["until"] or d["position"] + origin["unit"]))
        return lanes.remap(progress, obj["index"], count, block(count),
                           shard.drop_remainder, parent_len)

    made = resolve(state.lane, sh.process_count, sh.procs[0])
    assert isinstance(made, lanes.Lanes)
    return made


def longest_shard(plan: Plan, dataset: Dataset) -> IndexPlan:
    """The index plan of process 0, whose shard is the longest (every process must take as
    many steps to stay in lockstep)."""
    procs = plan.shape.procs
    if not procs:
        return plan.index
    resolved = _resolve(dataset, plan.meta, (0, procs[1]), plan.layout)
    return IndexPlan(plan.index.num_records, resolved.ops, resolved.block_starts,
                     plan.index.base)
