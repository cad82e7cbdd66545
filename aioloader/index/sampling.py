"""Output position → global record index: shuffles, epochs, shards, slices (pure NumPy).

This module owns the answer to "which record is the p-th element of the stream?". Every answer
is a pure function of `(seed, epoch, position)` (the permutations live in `permutation`), so
the state of the whole sampling pipeline is a few integers, resume after preemption is exact,
and shards, repeats and slices compose as index arithmetic.

Index ops (`Slice`, `Shuffle`, `Repeat`, `Shard`) are frozen, picklable dataclasses applied in
the order the user wrote them (`source → op1 → op2 → ...`); `IndexPlan` validates a chain and
maps output positions back through the ops in reverse (`aioloader.index.indexplan`). Each op
knows only `length(parent_len)` and `parent(positions, epochs, parent_len, chunk_starts)`;
epochs flow from the outermost `Repeat` inwards, so a `Shuffle` inside a `Repeat` is re-keyed
every epoch.
A block `Shuffle` is a description resolved by `plan.compile` into the ops of `blocks`
(`BlockShuffle`, `Windows`), whose `chunk_starts` are the blocks' record starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arguments import flag, maybe_whole, seed, whole
from .blocks import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW_BYTES, BlockShuffle, Windows
from .permutation import (
    block_shuffle,
    epoch_key,
    feistel_permute,
    mix64,
    permute_by_epoch,
)

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_WINDOW_BYTES",
    "BlockShuffle",
    "IndexOp",
    "Repeat",
    "Shard",
    "Shuffle",
    "Slice",
    "Windows",
    "block_shuffle",
    "epoch_key",
    "feistel_permute",
    "mix64",
]


# --------------------------------------------------------------------------- index ops


def _int_field(obj, name: str, lo: int | None = None, *, hi: int | None = None,
               optional: bool = False) -> None:
    """Check field `name` of op `obj` is a whole number in [lo, hi) (or None if `optional`)
    and store it as an int; the error names the op and the field (`Shard index`)."""
    what = f"{type(obj).__name__} {name}"
    value = getattr(obj, name)
    object.__setattr__(obj, name, maybe_whole(value, what, lo, hi=hi) if optional else
                       whole(value, what, lo, hi=hi))


def _require_finite(op, parent_len: int | None, why: str = "") -> int:
    if parent_len is None:
        raise ValueError(
            f"{type(op).__name__} needs a finite parent but follows an infinite repeat{why}; "
            f"put it before .repeat(None) or give repeat a finite num_epochs"
        )
    return parent_len


@dataclass(frozen=True)
class Slice:
    """Python slice semantics on the parent sequence (step != 0). An infinite parent (after
    `repeat()`) takes a slice that needs no end: `[a:b]`, `[a:b:c]` with 0 <= a, b, c > 0."""

    start: int | None = None
    stop: int | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        for name in ("start", "stop", "step"):
            _int_field(self, name, optional=True)
        if self.step == 0:
            raise ValueError("Slice step must not be zero")

    def _range(self, parent_len: int | None) -> range:
        start, step = self.start or 0, self.step or 1
        if parent_len is None and self.stop is not None and min(start, self.stop) >= 0 \
                and step > 0:
            return range(start, max(start, self.stop), step)
        n = _require_finite(self, parent_len)
        return range(*slice(self.start, self.stop, self.step).indices(n))

    def describe(self) -> str:
        return f"slice[{self.start}:{self.stop}:{self.step}]"

    def length(self, parent_len: int | None) -> int | None:
        return len(self._range(parent_len))

    def parent(
        self,
        positions: np.ndarray,
        epochs: np.ndarray,
        parent_len: int | None,
        chunk_starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        r = self._range(parent_len)
        return r.start + positions * r.step, epochs


@dataclass(frozen=True)
class Shuffle:
    """Permute the (finite) parent, re-keyed per epoch with `epoch_key(seed, epoch)`.

    `strategy="exact"`: a Feistel permutation of the whole parent. `strategy="block"`: the
    source cut into blocks (runs of whole chunks) of about `block_bytes`, the blocks in a
    keyed order, and records shuffled within windows of about `window_bytes` (decoded);
    valid only as the first op. It is a description: `plan.compile` resolves it, once the
    files' sizes are known, into `blocks.BlockShuffle` (and, sharded by JAX process,
    `blocks.Windows`), whose docstrings say what each process reads and why resume stays
    exact.
    """

    seed: int
    strategy: str = "exact"
    block_bytes: int = 0  # block strategy; 0: sized from the budgets (`blocks.budget_sizes`)
    window_bytes: int = 0  # block strategy; 0: sized from the budgets

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", seed(self.seed, "Shuffle seed"))
        for name in ("block_bytes", "window_bytes"):
            _int_field(self, name)
        if self.strategy not in ("exact", "block"):
            raise ValueError(f"Shuffle strategy must be 'exact' or 'block', got {self.strategy!r}")
        if self.strategy == "exact":
            if self.block_bytes or self.window_bytes:
                raise ValueError("block_bytes/window_bytes apply only to strategy='block'")
            return
        for name in ("block_bytes", "window_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"block shuffle needs {name} >= 1, got {getattr(self, name)}")

    def describe(self) -> str:
        if self.strategy == "block":
            return (f"shuffle(seed={self.seed}, block, block_bytes={self.block_bytes or 'auto'}"
                    f", window_bytes={self.window_bytes or 'auto'})")
        return f"shuffle(seed={self.seed})"

    def length(self, parent_len: int | None) -> int | None:
        return _require_finite(self, parent_len, " (a shuffle must see the whole sequence)")

    def parent(
        self,
        positions: np.ndarray,
        epochs: np.ndarray,
        parent_len: int | None,
        chunk_starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        n = _require_finite(self, parent_len)
        if self.strategy == "block":
            raise ValueError(UNRESOLVED_BLOCK)
        return permute_by_epoch(positions, epochs, n, self.seed), epochs


UNRESOLVED_BLOCK = ("a block Shuffle is resolved against the files' block sizes by plan.compile "
               "(into blocks.BlockShuffle / blocks.Windows) before it can run")


@dataclass(frozen=True)
class Repeat:
    """Repeat a finite parent `num_epochs` times (None: forever); an empty parent repeated
    is empty, as in Grain.

    Output position p is parent position `p % L` in epoch `incoming * num_epochs + p // L`.
    """

    num_epochs: int | None = None

    def __post_init__(self) -> None:
        _int_field(self, "num_epochs", 1, optional=True)

    def describe(self) -> str:
        return f"repeat({self.num_epochs if self.num_epochs is not None else 'forever'})"

    def length(self, parent_len: int | None) -> int | None:
        n = _require_finite(self, parent_len)
        return None if self.num_epochs is None and n else n * (self.num_epochs or 0)

    def parent(
        self,
        positions: np.ndarray,
        epochs: np.ndarray,
        parent_len: int | None,
        chunk_starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        n = _require_finite(self, parent_len)
        if n == 0:  # an empty repeat has no positions to map
            return positions, epochs
        epoch, pos = np.divmod(positions, n)
        if self.num_epochs is not None:
            epoch = epoch + epochs * self.num_epochs
        return pos, epoch


@dataclass(frozen=True)
class Shard:
    """Take shard `index` of `count`.

    Strided (default): parent positions `index, index + count, ...` (works on infinite
    parents); with `block=b`, blocks of b consecutive positions are dealt out in turn (shard i
    takes positions [i*b, (i+1)*b) of every round of b*count) — with b = the per-process
    batch size, every global batch is the next b*count positions of the parent, whatever the
    process count, which is what makes elastic resume possible.
    Contiguous: the index-th of `count` near-equal blocks, the first `L % count` one
    longer (like `numpy.array_split`; finite parents only). `drop_remainder=True` gives every
    shard `L // count` positions (lockstep across hosts). Shards are disjoint; without
    drop_remainder they cover the parent.
    """

    index: int
    count: int
    contiguous: bool = False
    drop_remainder: bool = False
    block: int = 1

    def __post_init__(self) -> None:
        _int_field(self, "count", 1)
        _int_field(self, "index", 0, hi=self.count)
        _int_field(self, "block")
        for name in ("contiguous", "drop_remainder"):
            object.__setattr__(self, name, flag(getattr(self, name), f"Shard {name}"))
        if self.block < 1 or (self.contiguous and self.block != 1):
            raise ValueError(f"Shard block must be >= 1 (and 1 when contiguous), got {self.block}")

    def _block(self, parent_len: int | None) -> tuple[int, int]:
        """(start, length) of this contiguous shard."""
        n = _require_finite(self, parent_len, " (use a strided shard for infinite streams)")
        base, rem = divmod(n, self.count)
        if self.drop_remainder:
            return self.index * base, base
        return self.index * base + min(self.index, rem), base + (self.index < rem)

    def describe(self) -> str:
        return f"shard({self.index}/{self.count})"

    def length(self, parent_len: int | None) -> int | None:
        if self.contiguous:
            return self._block(parent_len)[1]
        if parent_len is None:
            return None
        b = self.block
        rounds, rest = divmod(parent_len, b * self.count)
        if self.drop_remainder:
            return rounds * b
        return rounds * b + min(max(rest - self.index * b, 0), b)

    def parent(
        self,
        positions: np.ndarray,
        epochs: np.ndarray,
        parent_len: int | None,
        chunk_starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.contiguous:
            return self._block(parent_len)[0] + positions, epochs
        limit = (np.iinfo(np.int64).max - (self.index + 1) * self.block) // self.count
        if positions.size and int(positions.max()) > limit:
            raise IndexError(f"{self!r}: position {int(positions.max())} overflows int64")
        if self.block == 1:
            return self.index + positions * self.count, epochs
        b = self.block
        rounds, within = np.divmod(positions, b)
        return rounds * (b * self.count) + self.index * b + within, epochs


IndexOp = Slice | Shuffle | Repeat | Shard | BlockShuffle | Windows
