"""Output position → global record index: shuffles, epochs, shards (pure NumPy, no I/O).

This module owns the answer to "which record is the p-th element of the stream?". Every answer
is a pure function of `(seed, epoch, position)`: there is no shuffle buffer and no permutation
table. The exact global shuffle is a keyed Feistel network over the smallest even-bit domain
that holds the `n` records, brought back into `[0, n)` by cycle walking — a bijection that costs
O(1) memory and evaluates any position on its own, vectorized. Because any position is
addressable, the state of the whole sampling pipeline is a few integers (seed, position), resume
after preemption is exact, and shards, repeats and slices compose as index arithmetic.

`block_shuffle` trades some randomness for I/O: it shuffles the order of chunks and then only
records within a window of chunks, so a reader of files with big chunks touches `window` chunks
at a time instead of one chunk per record.

Index ops (`Slice`, `Shuffle`, `Repeat`, `Shard`) are frozen, picklable dataclasses applied in
the order the user wrote them (`source → op1 → op2 → ...`); `IndexPlan` validates a chain and
maps output positions back through the ops in reverse. Each op knows only
`length(parent_len)` and `parent(positions, epochs, parent_len, chunk_starts)`; epochs flow
from the outermost `Repeat` inwards, so a `Shuffle` inside a `Repeat` is re-keyed every epoch.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

__all__ = [
    "IndexOp",
    "IndexPlan",
    "Repeat",
    "Shard",
    "Shuffle",
    "Slice",
    "block_shuffle",
    "epoch_key",
    "feistel_permute",
    "mix64",
]

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / golden ratio, odd
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_U_C1 = np.uint64(_C1)
_U_C2 = np.uint64(_C2)
_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_POW2 = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))  # for bit lengths


# --------------------------------------------------------------------------- mixing and keys


def _mix_inplace(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array, in place (callers hold errstate)."""
    z ^= z >> _U30
    z *= _U_C1
    z ^= z >> _U27
    z *= _U_C2
    z ^= z >> _U31
    return z


@overload
def mix64(x: int) -> int: ...
@overload
def mix64(x: np.ndarray) -> np.ndarray: ...
def mix64(x: np.ndarray | int) -> np.ndarray | int:
    """The splitmix64 finalizer: a bijective, avalanching mix of 64-bit values.

    Arrays are taken modulo 2^64 (negative int64 wrap) and returned as new uint64 arrays;
    Python ints are taken modulo 2^64 and returned as ints in [0, 2^64).
    """
    if isinstance(x, np.ndarray):
        with np.errstate(over="ignore"):
            return _mix_inplace(x.astype(np.uint64, copy=True))
    z = operator.index(x) & _M64
    z = ((z ^ (z >> 30)) * _C1) & _M64
    z = ((z ^ (z >> 27)) * _C2) & _M64
    return z ^ (z >> 31)


def _absorb(key: int, value: int) -> int:
    return mix64(((key ^ (operator.index(value) & _M64)) + _GOLDEN) & _M64)


def epoch_key(seed: int, epoch: int, salt: int = 0) -> int:
    """A 64-bit key for `(seed, epoch, salt)`.

    Each input is absorbed through a bijective mix, so distinct epochs (or salts) under one
    seed always give distinct keys, and nearby ones give unrelated keys.
    """
    return _absorb(_absorb(_absorb(0, seed), epoch), salt)


def _epoch_keys(seed: int, epochs: np.ndarray) -> np.ndarray:
    """`epoch_key(seed, e)` for every e of an int array, as uint64 (vectorized)."""
    gamma = np.uint64(_GOLDEN)
    with np.errstate(over="ignore"):
        k = _mix_inplace((np.uint64(_absorb(0, seed)) ^ epochs.astype(np.uint64)) + gamma)
        return _mix_inplace(k + gamma)  # absorb salt 0


def _round_keys(key: int, rounds: int) -> list[np.uint64]:
    return [np.uint64(mix64((key + (i + 1) * _GOLDEN) & _M64)) for i in range(rounds)]


def _round_keys_array(keys: np.ndarray, rounds: int) -> list[np.ndarray]:
    with np.errstate(over="ignore"):
        return [mix64(keys + np.uint64(((i + 1) * _GOLDEN) & _M64)) for i in range(rounds)]


# --------------------------------------------------------------------------- Feistel core


def _half_bits(n: int) -> int:
    """Smallest h >= 1 with 4**h >= n."""
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _half_bits_array(n: np.ndarray) -> np.ndarray:
    v = np.maximum(n.astype(np.int64) - 1, 0).astype(np.uint64)
    bit_length = np.searchsorted(_POW2, v, side="right")
    return np.maximum(1, (bit_length + 1) // 2).astype(np.uint64)


def _feistel_pass(x: np.ndarray, h, mask, rks) -> np.ndarray:
    """One pass of the balanced Feistel network over 2h-bit uint64 values.

    `h`, `mask` and each round key are uint64 scalars or arrays aligned with `x`.
    """
    left = x >> h
    right = x & mask
    for rk in rks:
        f = right ^ rk
        _mix_inplace(f)
        f &= mask
        f ^= left
        left, right = right, f
    left <<= h
    left |= right
    return left


def _take(v, idx: np.ndarray):
    return v[idx] if isinstance(v, np.ndarray) else v


def _cycle_walk(x: np.ndarray, n, h, mask, rks) -> np.ndarray:
    """Apply the network until every value is below `n` (scalar or per element).

    The domain is < 4n, so each value is in range with probability > 1/4 per pass; only the
    still-out-of-range subset is walked again.
    """
    with np.errstate(over="ignore"):
        out = _feistel_pass(x, h, mask, rks)
        todo = np.flatnonzero(out >= n)
        while todo.size:
            sub = _feistel_pass(
                out[todo], _take(h, todo), _take(mask, todo), [_take(rk, todo) for rk in rks]
            )
            out[todo] = sub
            todo = todo[sub >= _take(n, todo)]
    return out


def _as_positions(positions, n: int, what: str) -> np.ndarray:
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu":
        if pos.size == 0:
            pos = pos.astype(np.int64)
        else:
            raise TypeError(f"{what}: positions must be integers, got dtype {pos.dtype}")
    pos = pos.astype(np.int64, copy=False)
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        bad = pos[(pos < 0) | (pos >= n)][0]
        raise ValueError(f"{what}: position {int(bad)} outside [0, {n})")
    return pos


def feistel_permute(positions: np.ndarray, n: int, key: int, rounds: int = 6) -> np.ndarray:
    """A keyed bijection on `[0, n)`, evaluated at `positions` (vectorized, int64 out).

    Balanced Feistel network on the smallest domain 2^(2h) >= n (h >= 1), round function
    `mix64(right ^ round_key) & mask`, then cycle walking into `[0, n)`. Raises ValueError for
    positions outside `[0, n)`.
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"feistel_permute: n must be >= 0, got {n}")
    if rounds < 1:
        raise ValueError(f"feistel_permute: rounds must be >= 1, got {rounds}")
    pos = _as_positions(positions, n, "feistel_permute")
    if n <= 1 or pos.size == 0:
        return np.zeros(pos.shape, dtype=np.int64)
    h = _half_bits(n)
    rks = _round_keys(operator.index(key) & _M64, rounds)
    out = _cycle_walk(
        pos.ravel().astype(np.uint64), np.uint64(n), np.uint64(h), np.uint64((1 << h) - 1), rks
    )
    return out.view(np.int64).reshape(pos.shape)


# --------------------------------------------------------------------------- block shuffle


def _check_chunk_starts(chunk_starts) -> np.ndarray:
    cs = np.asarray(chunk_starts)
    if cs.ndim != 1 or cs.size == 0 or cs.dtype.kind not in "iu":
        raise ValueError("chunk_starts must be a 1-D integer array of length K+1 (prefix sums)")
    cs = cs.astype(np.int64, copy=False)
    if cs[0] != 0 or np.any(np.diff(cs) < 0):
        raise ValueError("chunk_starts must start at 0 and be non-decreasing (prefix sums)")
    return cs


def block_shuffle(
    positions: np.ndarray, chunk_starts: np.ndarray, key: int, window: int
) -> np.ndarray:
    """An I/O-friendly permutation of `[0, n)`, `n = chunk_starts[-1]`, at `positions`.

    The K chunks (chunk c holds records `[chunk_starts[c], chunk_starts[c+1])`, possibly none)
    are put in the order `feistel_permute(arange(K), K, key)`; consecutive runs of `window`
    chunks of that order form windows, emitted one after the other; within window w, records
    are permuted by a Feistel keyed on `(key, w)`. So output positions of one window draw from
    at most `window` chunks. Costs O(K) per call plus O(len(positions) log K).
    """
    window = operator.index(window)
    if window < 1:
        raise ValueError(f"block_shuffle: window must be >= 1 chunk, got {window}")
    cs = _check_chunk_starts(chunk_starts)
    n = int(cs[-1])
    pos = _as_positions(positions, n, "block_shuffle")
    if pos.size == 0:
        return np.zeros(pos.shape, dtype=np.int64)
    flat = pos.ravel()
    key = operator.index(key) & _M64
    k = cs.size - 1
    counts = np.diff(cs)
    order = feistel_permute(np.arange(k, dtype=np.int64), k, key)  # slot j holds chunk order[j]
    slot_starts = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts[order], out=slot_starts[1:])
    num_windows = -(-k // window)
    win_starts = slot_starts[np.minimum(np.arange(num_windows + 1) * window, k)]
    # The largest w with win_starts[w] <= p: a non-empty window, since p < n.
    w = np.searchsorted(win_starts, flat, side="right") - 1
    base = win_starts[w]
    sizes = (win_starts[1:] - win_starts[:-1])[w]
    wkeys = mix64((np.uint64(key) ^ np.arange(num_windows, dtype=np.uint64)) + np.uint64(_GOLDEN))
    rks = [rk[w] for rk in _round_keys_array(wkeys, 6)]
    h = _half_bits_array(sizes)
    mask = (np.uint64(1) << h) - np.uint64(1)
    local = _cycle_walk((flat - base).astype(np.uint64), sizes.astype(np.uint64), h, mask, rks)
    q = base + local.view(np.int64)
    slot = np.searchsorted(slot_starts, q, side="right") - 1
    out = cs[order[slot]] + (q - slot_starts[slot])
    return out.reshape(pos.shape)


# --------------------------------------------------------------------------- index ops


def _int_field(obj, name: str, *, optional: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{type(obj).__name__}.{name} must be an int, got {value!r}")
    object.__setattr__(obj, name, int(value))


def _require_finite(op, parent_len: int | None, why: str = "") -> int:
    if parent_len is None:
        raise ValueError(
            f"{type(op).__name__} needs a finite parent but follows an infinite repeat{why}; "
            f"put it before .repeat(None) or give repeat a finite num_epochs"
        )
    return parent_len


@dataclass(frozen=True)
class Slice:
    """Python slice semantics on the parent sequence (finite parent; step != 0)."""

    start: int | None = None
    stop: int | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        for name in ("start", "stop", "step"):
            _int_field(self, name, optional=True)
        if self.step == 0:
            raise ValueError("Slice step must not be zero")

    def _range(self, parent_len: int | None) -> range:
        n = _require_finite(self, parent_len)
        return range(*slice(self.start, self.stop, self.step).indices(n))

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

    `strategy="exact"`: a Feistel permutation of the whole parent. `strategy="block"`:
    `block_shuffle` over the source's chunks with `window` chunks per window; valid only as the
    first op, directly on the source.
    """

    seed: int
    strategy: str = "exact"
    window: int = 0

    def __post_init__(self) -> None:
        _int_field(self, "seed")
        _int_field(self, "window")
        if self.strategy not in ("exact", "block"):
            raise ValueError(f"Shuffle strategy must be 'exact' or 'block', got {self.strategy!r}")
        if self.strategy == "block" and self.window < 1:
            raise ValueError(f"block shuffle needs window >= 1 chunk, got {self.window}")
        if self.strategy == "exact" and self.window != 0:
            raise ValueError("Shuffle window applies only to strategy='block'")

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
        if self.strategy == "exact":
            return _permute_by_epoch(positions, epochs, n, self.seed), epochs
        if chunk_starts is None:
            raise ValueError("block shuffle needs the source's chunk_starts")
        starts = chunk_starts

        def permute(p: np.ndarray, epoch: int) -> np.ndarray:
            return block_shuffle(p, starts, epoch_key(self.seed, epoch), self.window)

        return _by_epoch(positions, epochs, permute), epochs


def _permute_by_epoch(positions: np.ndarray, epochs: np.ndarray, n: int, seed: int) -> np.ndarray:
    """`feistel_permute(p, n, epoch_key(seed, e))` element-wise, in one vectorized pass.

    With several epochs in the batch, each element gets its epoch's round keys (computed once
    per distinct epoch), so random access across many epochs costs no per-epoch call.
    """
    if positions.size == 0 or np.all(epochs == epochs[0]):
        e = int(epochs[0]) if positions.size else 0
        return feistel_permute(positions, n, epoch_key(seed, e))
    pos = _as_positions(positions, n, "shuffle")
    if n <= 1:
        return np.zeros(pos.shape, dtype=np.int64)
    uniq, inverse = np.unique(epochs, return_inverse=True)
    keys = _epoch_keys(seed, uniq)
    rks = [rk[inverse.ravel()] for rk in _round_keys_array(keys, 6)]
    h = _half_bits(n)
    out = _cycle_walk(
        pos.ravel().astype(np.uint64), np.uint64(n), np.uint64(h), np.uint64((1 << h) - 1), rks
    )
    return out.view(np.int64).reshape(pos.shape)


def _by_epoch(
    positions: np.ndarray, epochs: np.ndarray, fn: Callable[[np.ndarray, int], np.ndarray]
) -> np.ndarray:
    """Apply `fn(positions_of_epoch, epoch)` group by group (one call per distinct epoch)."""
    if positions.size == 0:
        return positions.copy()
    first = int(epochs[0])
    if np.all(epochs == first):
        return fn(positions, first)
    order = np.argsort(epochs, kind="stable")
    sorted_epochs = epochs[order]
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(sorted_epochs)) + 1, [order.size]))
    out = np.empty_like(positions)
    for a, b in itertools.pairwise(bounds):
        idx = order[a:b]
        out[idx] = fn(positions[idx], int(sorted_epochs[a]))
    return out


@dataclass(frozen=True)
class Repeat:
    """Repeat a finite, non-empty parent `num_epochs` times (None: forever).

    Output position p is parent position `p % L` in epoch `incoming * num_epochs + p // L`.
    """

    num_epochs: int | None = None

    def __post_init__(self) -> None:
        _int_field(self, "num_epochs", optional=True)
        if self.num_epochs is not None and self.num_epochs < 0:
            raise ValueError(f"Repeat num_epochs must be >= 0 or None, got {self.num_epochs}")

    def _parent_len(self, parent_len: int | None) -> int:
        n = _require_finite(self, parent_len)
        if n == 0:
            raise ValueError(f"{self!r} of an empty sequence would never yield anything")
        return n

    def length(self, parent_len: int | None) -> int | None:
        n = self._parent_len(parent_len)
        return None if self.num_epochs is None else n * self.num_epochs

    def parent(
        self,
        positions: np.ndarray,
        epochs: np.ndarray,
        parent_len: int | None,
        chunk_starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        epoch, pos = np.divmod(positions, self._parent_len(parent_len))
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
        _int_field(self, "index")
        _int_field(self, "count")
        _int_field(self, "block")
        if self.block < 1 or (self.contiguous and self.block != 1):
            raise ValueError(f"Shard block must be >= 1 (and 1 when contiguous), got {self.block}")
        if self.count < 1:
            raise ValueError(f"Shard count must be >= 1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"Shard index must be in [0, {self.count}), got {self.index}")

    def _block(self, parent_len: int | None) -> tuple[int, int]:
        """(start, length) of this contiguous shard."""
        n = _require_finite(self, parent_len, " (use a strided shard for infinite streams)")
        base, rem = divmod(n, self.count)
        if self.drop_remainder:
            return self.index * base, base
        return self.index * base + min(self.index, rem), base + (self.index < rem)

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


IndexOp = Slice | Shuffle | Repeat | Shard


# --------------------------------------------------------------------------- the plan


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
    ) -> None:
        num_records = operator.index(num_records)
        if num_records < 0:
            raise ValueError(f"num_records must be >= 0, got {num_records}")
        self.num_records = num_records
        self.ops: tuple[IndexOp, ...] = tuple(ops)
        self.chunk_starts = None
        if chunk_starts is not None:
            cs = _check_chunk_starts(chunk_starts)
            if int(cs[-1]) != num_records:
                raise ValueError(
                    f"chunk_starts ends at {int(cs[-1])} but the source has {num_records} records"
                )
            self.chunk_starts = cs
        lengths: list[int | None] = [num_records]
        for i, op in enumerate(self.ops):
            if not isinstance(op, (Slice, Shuffle, Repeat, Shard)):
                raise TypeError(f"op {i} is not an index op: {op!r}")
            if isinstance(op, Shuffle) and op.strategy == "block":
                if i != 0:
                    raise ValueError(
                        f"op {i}: block shuffle works on the source's chunks, so it must come "
                        f"first, directly on the source (found after {self.ops[i - 1]!r}); "
                        "use strategy='exact' here or move the block shuffle first"
                    )
                if self.chunk_starts is None:
                    raise ValueError("block shuffle needs the source's chunk_starts")
            try:
                lengths.append(op.length(lengths[-1]))
            except ValueError as e:
                raise ValueError(f"op {i} ({op!r}): {e}") from None
        self.lengths: tuple[int | None, ...] = tuple(lengths)
        repeats = [i for i, op in enumerate(self.ops) if isinstance(op, Repeat)]
        self._outer_repeat = repeats[-1] if repeats else None
        self.epoch_length = self._epoch_length()

    @property
    def length(self) -> int | None:
        """Number of output positions; None if infinite."""
        return self.lengths[-1]

    def _epoch_length(self) -> int | None:
        r = self._outer_repeat
        if r is None:
            return self.length
        period, phase = self.lengths[r], 0  # epoch(x) = (x + phase) // period + const
        assert period is not None
        for i in range(r + 1, len(self.ops)):
            op = self.ops[i]
            if isinstance(op, Shuffle):
                return None
            if isinstance(op, Slice):
                rng = op._range(self.lengths[i])
                start, stride = rng.start, rng.step
                if stride < 0:
                    return None
            elif isinstance(op, Shard) and op.contiguous:
                start, stride = op._block(self.lengths[i])[0], 1
            else:
                assert isinstance(op, Shard)
                start, stride = op.index, op.count
            if period % stride:
                return None
            period, phase = period // stride, (start + phase) // stride
        return period if phase % period == 0 else None

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record indices, epochs), both int64 and shaped like `positions`.

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
        epochs = np.zeros_like(pos)
        reported = epochs
        for i in range(len(self.ops) - 1, -1, -1):
            pos, epochs = self.ops[i].parent(pos, epochs, self.lengths[i], self.chunk_starts)
            if i == self._outer_repeat:
                reported = epochs
        return pos.reshape(shape), reported.reshape(shape)

    def __repr__(self) -> str:
        ops = " → ".join(repr(op) for op in self.ops)
        return f"IndexPlan({self.num_records} records{' → ' + ops if ops else ''})"
