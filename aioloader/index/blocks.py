"""The block shuffle's resolved index ops: `BlockShuffle` (blocks in a keyed order, records
shuffled within windows of blocks) and `Windows` (record windows cut in lanes that processes
read on their own). Pure NumPy.

A user's `Shuffle(strategy="block", block_bytes, window_bytes)` says what is wanted in bytes;
`plan.compile` resolves it, once the files' sizes are known, into these ops over the blocks'
record starts (`RecordTable.run_record_starts(block_bytes)`):

- one process: `BlockShuffle(seed, window=k)`, `k = max(1, round(window_bytes /
  block_bytes))` blocks per window, as the first op;
- sharded by JAX process: `BlockShuffle(seed, window=0)` (the blocks' order only) first, and a
  `Windows` op just before the process `Shard`, whose windows are `size` records (about
  `window_bytes`, a multiple of the global batch) of that order, each cut in one lane per
  process: process p's share of every global batch comes from lane p, so each process reads
  only its ~1/P of every window's bytes. Which lane count a window has is fixed when the
  window begins (see `Windows`), which is what keeps elastic resume exact.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import numpy as np

from .permutation import apply_per_epoch, block_order, block_shuffle, epoch_key, window_lanes

__all__ = ["DEFAULT_BLOCK_BYTES", "DEFAULT_WINDOW_BYTES", "BlockShuffle", "Windows",
           "budget_sizes", "unfit"]

DEFAULT_BLOCK_BYTES = 4 << 20  # a block: ~one large read from a bucket
DEFAULT_WINDOW_BYTES = 64 << 20  # a window: 16 blocks, held and shuffled in memory
MIN_BLOCKS = 4  # a window sized from a small budget still holds this many blocks


def budget_sizes(resident_bytes: int, memory_budget: int) -> tuple[int, int]:
    """The default `(block_bytes, window_bytes)`: 4 MiB and 64 MiB, less where the budgets
    cannot hold them. A window (and the next, fetched ahead) must fit the memory tier
    (`resident_bytes`; 0: no tier, no bound) and the decoded-chunk cache (half of
    `memory_budget`), so it is at most half of each, and holds at least `MIN_BLOCKS` blocks
    (the tier's fewest segments). A function of the settings only: same batches whatever
    the files' place, workers or timing."""
    window = min(DEFAULT_WINDOW_BYTES, memory_budget // 2,
                 resident_bytes // 2 if resident_bytes else DEFAULT_WINDOW_BYTES)
    window = max(MIN_BLOCKS, window)
    return max(1, min(DEFAULT_BLOCK_BYTES, window // MIN_BLOCKS)), window


def unfit(block_bytes: int, window_bytes: int, resident_bytes: int,
          segment_bytes: int | None = None) -> str | None:
    """Why blocks of `block_bytes` in windows of `window_bytes` cannot be held by a bounded
    memory tier of `resident_bytes` (a window, in at least `MIN_BLOCKS` segments of
    `segment_bytes`, at most the blocks'), or None if they can."""
    window = max(block_bytes, window_bytes)
    segment = min(block_bytes, segment_bytes or block_bytes)
    if window <= resident_bytes and MIN_BLOCKS * segment <= resident_bytes:
        return None
    need = max(window, MIN_BLOCKS * segment)
    return (f"a block shuffle with block_bytes={block_bytes} and window_bytes={window_bytes} "
            f"needs resident_bytes >= {need} (a window, at least {MIN_BLOCKS} segments) to "
            f"read a remote dataset larger than resident_bytes={resident_bytes} in blocks; "
            f"else every record is its own request (~100x slower): raise resident_bytes to "
            f"{need}, or lower window_bytes (and block_bytes), or leave both unset to have "
            f"them sized from resident_bytes and memory_budget")


_WINDOW_SALT = 0x57494E44  # "WIND": window keys are unrelated to the block-order keys


def _as_int(obj, name: str) -> int:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{type(obj).__name__}.{name} must be an int, got {value!r}")
    object.__setattr__(obj, name, int(value))
    return int(value)


@dataclass(frozen=True)
class BlockShuffle:
    """Blocks (the source's runs of whole chunks, given to the plan as their record starts)
    in a keyed order per epoch; with `window >= 1`, records shuffled within each window of
    `window` consecutive blocks of that order (`permutation.block_shuffle`) — or, given the
    blocks' byte sizes `sizes`, windows of about `window` bytes (at least one block), so a
    window of large blocks (group_size 65536) holds few of them; with 0, records stay in
    order (`permutation.block_order`) for a later `Windows` op. First op only."""

    seed: int
    window: int = 0
    sizes: np.ndarray | None = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        return f"block_shuffle(seed={self.seed})"

    def __post_init__(self) -> None:
        _as_int(self, "seed")
        if _as_int(self, "window") < 0:
            raise ValueError(f"BlockShuffle window must be >= 0 blocks, got {self.window}")

    def length(self, parent_len: int | None) -> int | None:
        if parent_len is None:
            raise ValueError("a block shuffle works on the source; it cannot follow a repeat")
        return parent_len

    def parent(self, positions: np.ndarray, epochs: np.ndarray, parent_len: int | None,
               chunk_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if chunk_starts is None:
            raise ValueError("block shuffle needs the source's block record starts")
        starts = chunk_starts

        def permute(p: np.ndarray, epoch: int) -> np.ndarray:
            key = epoch_key(self.seed, epoch)
            if self.window:
                return block_shuffle(p, starts, key, self.window, self.sizes)
            return block_order(p, starts, key)

        return apply_per_epoch(positions, epochs, permute), epochs


@dataclass(frozen=True)
class Windows:
    """Shuffle within windows of `size` positions, each window in lanes (see
    `permutation.window_lanes`); length-preserving, works on endless streams.

    `group` is the global batch (the per-process batch times the process count) and `lanes`
    the process count: with the process `Shard(block=group // lanes)` after it, process p
    takes lane p of every window. `layout` records earlier process counts of the same run
    (elastic resume), as `(end, count)` pairs, ends increasing: `count` ran the stream up to
    global position `end`. A window keeps the lane count of the processes that began it
    (the first pair whose end lies past the window's start, else `lanes`), so a state saved
    mid-window resumes on another process count exactly: the rest of that window's global
    batches are the same sets of records, only dealt to more or fewer processes.
    """

    seed: int
    size: int
    group: int = 1
    lanes: int = 1
    layout: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        return f"windows(seed={self.seed}, size={self.size})"

    def __post_init__(self) -> None:
        for name in ("seed", "size", "group", "lanes"):
            _as_int(self, name)
        layout = tuple((operator.index(e), operator.index(c)) for e, c in self.layout)
        object.__setattr__(self, "layout", layout)
        if self.size < 1 or self.group < 1 or self.size % self.group:
            raise ValueError(f"Windows size {self.size} must be a positive multiple of the "
                             f"global batch {self.group}")
        ends = [e for e, _ in layout]
        if ends != sorted(ends) or any(e < 0 for e in ends):
            raise ValueError(f"Windows layout ends must be >= 0 and increasing: {layout}")
        for count in (self.lanes, *(c for _, c in layout)):
            if count < 1 or self.group % count:
                raise ValueError(f"Windows lane count {count} must divide the global batch "
                                 f"{self.group}")

    def length(self, parent_len: int | None) -> int | None:
        return parent_len

    def lanes_at(self, window_starts: np.ndarray) -> np.ndarray:
        """The lane count of the windows beginning at `window_starts` (global positions)."""
        if not self.layout:
            return np.full(window_starts.shape, self.lanes, dtype=np.int64)
        ends = np.array([e for e, _ in self.layout], dtype=np.int64)
        counts = np.array([c for _, c in self.layout] + [self.lanes], dtype=np.int64)
        return counts[np.searchsorted(ends, window_starts, side="right")]

    def parent(self, positions: np.ndarray, epochs: np.ndarray, parent_len: int | None,
               chunk_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        def permute(p: np.ndarray, epoch: int) -> np.ndarray:
            key = epoch_key(self.seed, epoch, _WINDOW_SALT)
            lanes = self.lanes_at(p // self.size * self.size)
            out = window_lanes(p, key, self.size, self.group, lanes, parent_len)
            return out.reshape(p.shape)

        return apply_per_epoch(positions, epochs, permute), epochs
