"""A validated chain of index ops (`aioloader.index.sampling`), mapping output positions back to
record indices and epochs (pure NumPy): the ops say what each step means, the plan checks the
chain once and runs positions through it in reverse.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from .blocks import BlockShuffle, Windows
from .permutation import check_chunk_starts
from .sampling import UNRESOLVED_BLOCK, IndexOp, Repeat, Shard, Shuffle, Slice
from .selection import PositionIndex

__all__ = ["IndexPlan"]


class IndexPlan:
    """A validated chain of index ops over `num_records` source records.

    `lookup(positions)` maps output positions to `(record indices, epochs)`. The epoch reported
    is the outermost `Repeat`'s count (0 without a repeat) — the epoch random transforms should
    key on. Inner shuffles key on the full epoch seen at their place in the chain (for nested
    repeats, `outer * num_epochs + inner`).

    `epoch_length` is E when epochs at the output are consecutive runs of E positions aligned
    at position 0 (epoch(p) = epoch(0) + p // E; a finite plan's last run may be shorter):
    the length without a repeat, the repeated length after a repeat, divided by each later
    stride (shard count, slice step) that divides it. It is None otherwise: a shuffle after the
    outermost repeat mixes epochs, and a stride or offset that does not align with the epoch
    makes runs uneven.
    """

    def __init__(
        self,
        num_records: int,
        ops: Sequence[IndexOp],
        chunk_starts: np.ndarray | None = None,
        base: PositionIndex | None = None,
    ) -> None:
        """`base`: the ops apply to its positions, not to the records (`selection`: a mix or
        a concatenation), and it maps them on to records."""
        num_records = operator.index(num_records)
        if num_records < 0:
            raise ValueError(f"num_records must be >= 0, got {num_records}")
        self.num_records = num_records
        self.ops: tuple[IndexOp, ...] = tuple(ops)
        self.chunk_starts = None
        if chunk_starts is not None:
            cs = check_chunk_starts(chunk_starts)
            if int(cs[-1]) != num_records:
                raise ValueError(
                    f"chunk_starts ends at {int(cs[-1])} but the source has {num_records} records"
                )
            self.chunk_starts = cs
        self.base = base
        lengths: list[int | None] = [num_records if base is None else base.length]
        for i, op in enumerate(self.ops):
            if not isinstance(op, (Slice, Shuffle, Repeat, Shard, BlockShuffle, Windows)) \
                    and not getattr(op, "index_op", False):  # `lanes.Lanes`
                raise TypeError(f"op {i} is not an index op: {op!r}")
            if isinstance(op, Shuffle) and op.strategy == "block":
                raise ValueError(f"op {i}: {UNRESOLVED_BLOCK}")
            if isinstance(op, BlockShuffle):
                if i != 0:
                    raise ValueError(
                        f"op {i}: block shuffle works on the source's blocks, so it must come "
                        f"first, directly on the source (found after {self.ops[i - 1]!r}); "
                        "use strategy='exact' here or move the block shuffle first"
                    )
                if self.chunk_starts is None or base is not None:
                    raise ValueError("block shuffle needs the source's chunk_starts "
                                     "(its blocks' record starts)")
            try:
                lengths.append(op.length(lengths[-1]))
            except ValueError as e:
                raise ValueError(f"op {i} ({op!r}): {e}") from None
            if isinstance(op, Repeat) and op.num_epochs is None and lengths[-2] == 0:
                _check_no_empty_shard(self.ops[:i], lengths)
        self.lengths: tuple[int | None, ...] = tuple(lengths)
        repeats = [i for i, op in enumerate(self.ops) if isinstance(op, Repeat)]
        self._outer_repeat = repeats[-1] if repeats else None
        self.epoch_length = self._epoch_length()

    @property
    def length(self) -> int | None:
        """Number of output positions; None if infinite."""
        return self.lengths[-1]

    def _epoch_length(self) -> int | None:
        if self.base is not None:  # the inputs' epochs follow their own lengths
            return None
        r = self._outer_repeat
        if r is None:
            return self.length
        period, phase = self.lengths[r], 0  # epoch(x) = (x + phase) // period + const
        if not period:  # an empty repeat: nothing to count
            return self.length
        for i in range(r + 1, len(self.ops)):
            op = self.ops[i]
            if isinstance(op, (Shuffle, Windows)):  # windows may straddle epochs
                return None
            if isinstance(op, Slice):
                rng = op._range(self.lengths[i])
                start, stride = rng.start, rng.step
                if stride < 0:
                    return None
            elif isinstance(op, Shard) and op.contiguous:
                start, stride = op._block(self.lengths[i])[0], 1
            elif isinstance(op, Shard):
                start, stride = op.index, op.count
            else:  # lanes of an elastic resume: epochs do not run in even steps
                return None
            if period % stride:
                return None
            period, phase = period // stride, (start + phase) // stride
        return period if phase % period == 0 else None

    def lookup(self, positions: np.ndarray,
               epochs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(record indices, epochs), both int64 and shaped like `positions`; `epochs`: the
        incoming ones (a repeat after a mix hands its epoch to the mix's inputs).

        Raises IndexError for positions < 0 or >= length.
        """
        pos = np.asarray(positions)
        if pos.dtype.kind not in "iu":
            if pos.size:
                raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
            pos = pos.astype(np.int64)
        shape = pos.shape
        pos = pos.astype(np.int64).ravel()
        if pos.size:
            lo, hi = int(pos.min()), int(pos.max())
            if lo < 0 or (self.length is not None and hi >= self.length):
                bad = lo if lo < 0 else hi
                raise IndexError(f"position {bad} out of range for a plan of length {self.length}")
        epochs = np.zeros_like(pos) if epochs is None else \
            np.asarray(epochs, dtype=np.int64).ravel()
        reported = epochs
        for i in range(len(self.ops) - 1, -1, -1):
            pos, epochs = self.ops[i].parent(pos, epochs, self.lengths[i], self.chunk_starts)
            if i == self._outer_repeat:
                reported = epochs
        if self.base is not None:  # the inputs report their own (given these epochs)
            pos, reported = self.base.lookup(pos, epochs)
        return pos.reshape(shape), reported.reshape(shape)

    def __repr__(self) -> str:
        ops = " → ".join(repr(op) for op in self.ops)
        return f"IndexPlan({self.num_records} records{' → ' + ops if ops else ''})"


def _check_no_empty_shard(ops: Sequence[IndexOp], lengths: Sequence[int | None]) -> None:
    """Refuse repeating forever a shard left empty while the records are not: it would end
    at once while its sibling shards never do (on several hosts, a training loop that waits
    forever in its first collective)."""
    for j, op in enumerate(ops):
        if isinstance(op, Shard) and not op.drop_remainder and lengths[j + 1] == 0 \
                and lengths[j]:
            raise ValueError(
                f"{op.describe()} of {lengths[j]} records holds none, so repeat() forever "
                "would end at once while the other shards never do; use fewer shards "
                "(processes) than records, or drop_remainder=True to give every shard the "
                "same count")
