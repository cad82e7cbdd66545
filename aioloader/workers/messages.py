"""The messages between the parent and its workers: the `Pipeline` every worker runs, a
`Task`, and its `Result`. Plain data (pickled across the process boundary), so that the
planner can build a pipeline without importing any of the worker's code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrayrecord.chunk import DEFAULT_MAX_DECODED, DEFAULT_VERIFY
from ..elements.transforms import BatchOp, MapOp, PackOp, RecordOp
from ..index.planning import ChunkRefs

# Decoded multi-record chunks kept across tasks, by all workers together (`Pool` gives each
# its share): as much as the parent's decoded-chunk cache held before workers decoded them.
DEFAULT_CHUNK_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class Pipeline:
    """What every worker runs (sent once, when the pool starts)."""

    record_ops: tuple[RecordOp, ...]
    batch: BatchOp | None  # collate in the worker; None: return elements (filter/pack mode)
    batch_ops: tuple[MapOp, ...]
    verify: str = DEFAULT_VERIFY
    max_decoded: int = DEFAULT_MAX_DECODED  # the most one chunk may decode to (memory_budget)
    # Decoded multi-record chunks kept across tasks, by all workers together: the pool gives
    # each worker its share (`Pool`).
    chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES
    stream: BatchOp | PackOp | None = None  # stream mode's batching (`workers.pieces`)
    # A `from_source()` object: records are read from it by index, not decoded from files
    # (`aioloader.describe.objects`).
    records: Any = None


@dataclass
class Task:
    """One unit of work: the records of one batch (or window), in output order.

    `refs` says where each record's chunk lies, whatever the group size; the worker decodes.
    For remote files the parent fetched the chunks: `raws`, parallel to `refs` (the pool moves
    them into the slot's input half, `raw_spans`, each distinct chunk once); without either,
    the files are local (or the memory copy of a remote dataset) and the worker reads them.
    """

    task_id: int
    indices: np.ndarray  # global record index of each record
    epochs: np.ndarray
    refs: ChunkRefs
    raws: list | None = None  # physical chunk bytes, parallel to refs
    raw_spans: list[tuple[int, int]] | None = None  # raws placed in the slot's input half
    slot: int = -1
    arena: tuple[str, int, bool, int] | None = None  # the slot's file (`Arena.where`)
    # Where the task's horizon keeps the records it wants of each large chunk, pulled out
    # once for all workers (`workers.extract`), when whole decoded chunks would not fit
    # the cache; or, for a fill job, the records of the task's one chunk to pull out there.
    stash: StashRef | None = None
    fill: Fill | None = None
    # Files of a contextual format (`formats.base`) decode by their contexts, which a worker
    # keeps by (`table`, the file's number in the source: `refs.ids`). A task carries none;
    # a worker that lacks some answers `Result.missing`, and the task goes again with them.
    table: str = ""
    contexts: dict[int, bytes] | None = None

    def chunk_bytes(self, mem: Any) -> list | None:
        """`raws`, or those placed in the slot's input half as views of `mem` (the arena's
        map); None: the worker reads the files itself."""
        if self.raw_spans is None:
            return self.raws
        view = memoryview(mem)
        return [view[o : o + n] for o, n in self.raw_spans]


@dataclass(frozen=True)
class StashRef:
    """Where one horizon's records lie in the stash file the workers share (`path`):
    chunk (name, start) -> (offset, bytes) of its entry (`workers.extract.read_entry`).
    A chunk not listed (or a record missing from its entry) is pulled out by the task."""

    path: str
    horizon: int
    at: dict[tuple[str, int], tuple[int, int]]
    # which fill of the stash this is (unique over the pool's life; -1: none): a region's
    # entry is the same while it is, so a worker may keep what it read of it
    serial: int = -1


@dataclass(frozen=True)
class Spill:
    """A chunk's region of the decoded-record spill (`workers.spill`), the file at `path`:
    `write`, the job decodes the chunk and writes all its `records` there, in at most
    `size` bytes from `offset`; else the region holds them (`size` bytes written) and the
    job copies its wanted records out of it instead of decoding the chunk. `ident`: the
    file's (device, inode), and `nonce`: its first bytes, which what `path` opens must have
    (its number, and its inode, may be another file's once the loader closed it)."""

    path: str
    offset: int
    size: int
    records: int
    write: bool
    ident: tuple[int, int] = (0, 0)
    nonce: bytes = b""


@dataclass(frozen=True)
class Fill:
    """A fill job: records `wanted` (sorted, distinct) of the task's one chunk, laid out at
    `offset` of the stash file `path` in at most `size` bytes (the longest prefix that fits);
    its Result's `count` says how many went in. `spill`: the chunk's region of the spill,
    to write or to read from (None: decoded, nothing kept)."""

    path: str
    offset: int
    size: int
    wanted: np.ndarray
    spill: Spill | None = None


@dataclass
class Result:
    """What a task gave, and what it cost.

    `op_items[i]` and `op_seconds[i]` are what op i received and the seconds it took in this
    task, op i counted over the pipeline's record ops (map, random_map, filter: elements
    received) then its batch ops (maps after batch: batches received). `chunks_decoded` is
    the chunks this task decoded that hold several records (each decoded once, however many
    of its records the task wanted) and `chunk_hits` those it found already decoded in the
    worker's cache; one-record chunks count in neither.
    """

    task_id: int
    payload: Any  # batch mode: a list of batches (arrays may be ShmRef); else `pieces`
    count: int  # elements that survived the filters
    slot: int = -1
    reads: int = 0  # local reads the worker made itself, and their bytes
    bytes_read: int = 0
    op_items: list[int] = dataclasses.field(default_factory=list)
    op_seconds: list[float] = dataclasses.field(default_factory=list)
    chunks_decoded: int = 0
    chunk_hits: int = 0
    stash_missed: int = 0  # records of a stashable format its horizon lacked: decoded here
    survivors: np.ndarray | None = None  # stream mode: each survivor's place in the task
    needed: int = 0  # > 0: the output did not fit the slot, and needs this many bytes
    largest: int = -1  # batch mode: `arena.slot_bytes` of its largest batch (-1: not known)
    # Where and when it ran, for the trace (`runtime.trace`): the process and thread, and
    # `time.perf_counter_ns()` at its start, once its records were decoded, and at its end
    # (CLOCK_MONOTONIC on Linux: the parent's clock too). Always measured: 3 clock reads
    # per task.
    pid: int = 0
    tid: int = 0
    began_ns: int = 0
    decoded_ns: int = 0
    ended_ns: int = 0
    # the files (numbers in the source) whose contexts the worker lacked: nothing was run
    missing: list[int] | None = None
    # a fill job with a spill region: bytes it wrote there (0: none), `SPILL_REFUSED` (the
    # disk refused a write), or `SPILL_BAD` (a region read back failed its checks)
    spilled: int = 0


SPILL_REFUSED = -1
SPILL_BAD = -2


