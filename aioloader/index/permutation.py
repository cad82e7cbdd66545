"""Keyed permutations of [0, n): the Feistel shuffle and the block shuffle (pure NumPy).

The exact global shuffle is a keyed Feistel network over the smallest even-bit domain that
holds the `n` records, brought back into `[0, n)` by cycle walking: a bijection that costs O(1)
memory and evaluates any position on its own, vectorized — so a shuffled stream needs no
shuffle buffer and no permutation table, and its state is just a position. `block_shuffle`
trades some randomness for I/O: it shuffles the order of blocks (runs of whole chunks) and
then only records within a window of blocks; `block_order` and `window_lanes` are the same
two steps apart, so that a window can be cut in lanes that processes read on their own. Keys
come from `epoch_key(seed, epoch)`, so every epoch has its own order.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import overload

import numpy as np

__all__ = [
    "apply_per_epoch",
    "block_order",
    "block_shuffle",
    "check_chunk_starts",
    "epoch_key",
    "feistel_permute",
    "mix64",
    "permute_by_epoch",
    "window_lanes",
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


def check_chunk_starts(chunk_starts) -> np.ndarray:
    cs = np.asarray(chunk_starts)
    if cs.ndim != 1 or cs.size == 0 or cs.dtype.kind not in "iu":
        raise ValueError("chunk_starts must be a 1-D integer array of length K+1 (prefix sums)")
    cs = cs.astype(np.int64, copy=False)
    if cs[0] != 0 or np.any(np.diff(cs) < 0):
        raise ValueError("chunk_starts must start at 0 and be non-decreasing (prefix sums)")
    return cs


def _slots(cs: np.ndarray, key: int) -> tuple[np.ndarray, np.ndarray]:
    """The blocks' keyed order (slot j holds block `order[j]`) and each slot's first position
    when the blocks are laid end to end in that order (K + 1 prefix sums)."""
    k = cs.size - 1
    order = feistel_permute(np.arange(k, dtype=np.int64), k, key)
    slot_starts = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.diff(cs)[order], out=slot_starts[1:])
    return order, slot_starts


def _unslot(q: np.ndarray, cs: np.ndarray, order: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Slot-order positions → record indices (empty blocks are skipped by the search)."""
    slot = np.searchsorted(slots, q, side="right") - 1
    return cs[order[slot]] + (q - slots[slot])


def block_order(positions: np.ndarray, block_starts: np.ndarray, key: int) -> np.ndarray:
    """Blocks in a keyed order, the records of each in place, at `positions`.

    Block b holds records `[block_starts[b], block_starts[b+1])`; the blocks are laid end to
    end in the order `feistel_permute(arange(K), K, key)` (the "slot order"). Consecutive
    output positions are consecutive records of one block, so a reader of any contiguous
    range of outputs touches only the blocks laid there.
    """
    cs = check_chunk_starts(block_starts)
    pos = _as_positions(positions, int(cs[-1]), "block_order")
    if pos.size == 0:
        return np.zeros(pos.shape, dtype=np.int64)
    order, slots = _slots(cs, operator.index(key) & _M64)
    return _unslot(pos.ravel(), cs, order, slots).reshape(pos.shape)


def block_shuffle(
    positions: np.ndarray, chunk_starts: np.ndarray, key: int, window: int,
    block_sizes: np.ndarray | None = None,
) -> np.ndarray:
    """An I/O-friendly permutation of `[0, n)`, `n = chunk_starts[-1]`, at `positions`.

    The K blocks (block c holds records `[chunk_starts[c], chunk_starts[c+1])`, possibly
    none: chunks, or runs of chunks) are put in the order `feistel_permute(arange(K), K,
    key)`; consecutive runs of `window` blocks of that order form windows, emitted one after
    the other; within window w, records are permuted by a Feistel keyed on `(key, w)`. So
    output positions of one window draw from at most `window` blocks. With `block_sizes`
    (K byte counts), `window` is bytes instead: a window is the blocks whose first byte, laid
    end to end in that order, falls in the same `window`-byte stretch (about `window` bytes,
    at least one block). Costs O(K) per call plus O(len(positions) log K).
    """
    window = operator.index(window)
    if window < 1:
        raise ValueError(f"block_shuffle: window must be >= 1 block, got {window}")
    cs = check_chunk_starts(chunk_starts)
    n = int(cs[-1])
    pos = _as_positions(positions, n, "block_shuffle")
    if pos.size == 0:
        return np.zeros(pos.shape, dtype=np.int64)
    flat = pos.ravel()
    key = operator.index(key) & _M64
    k = cs.size - 1
    order, slot_starts = _slots(cs, key)
    if block_sizes is None:
        num_windows = -(-k // window)
        first_slots = np.minimum(np.arange(num_windows + 1) * window, k)
    else:
        sizes_b = np.asarray(block_sizes, dtype=np.int64)
        if sizes_b.shape != (k,):
            raise ValueError(f"block_shuffle: {sizes_b.size} block sizes for {k} blocks")
        byte_starts = np.cumsum(sizes_b[order]) - sizes_b[order]
        wid = byte_starts // window
        first_slots = np.concatenate(([0], np.flatnonzero(np.diff(wid)) + 1, [k]))
        num_windows = first_slots.size - 1
    win_starts = slot_starts[first_slots]
    # The largest w with win_starts[w] <= p: a non-empty window, since p < n.
    w = np.searchsorted(win_starts, flat, side="right") - 1
    base = win_starts[w]
    sizes = (win_starts[1:] - win_starts[:-1])[w]
    wkeys = mix64((np.uint64(key) ^ np.arange(num_windows, dtype=np.uint64)) + np.uint64(_GOLDEN))
    local = _permute_within(flat - base, sizes, wkeys[w])
    return _unslot(base + local, cs, order, slot_starts).reshape(pos.shape)


def _permute_within(local: np.ndarray, sizes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Element i: `feistel_permute(local[i], sizes[i], keys[i])`, all at once (int64)."""
    rks = _round_keys_array(keys, 6)
    h = _half_bits_array(sizes)
    mask = (np.uint64(1) << h) - np.uint64(1)
    out = _cycle_walk(local.astype(np.uint64), sizes.astype(np.uint64), h, mask, rks)
    return out.view(np.int64)


def window_lanes(positions: np.ndarray, key: int, size: int, group: int, lanes: np.ndarray,
                 parent_len: int | None = None) -> np.ndarray:
    """Windows of `size` consecutive positions, each shuffled in `lanes` lanes, at `positions`.

    Window g is parent positions `[g*size, (g+1)*size)` (the last one shorter when
    `parent_len` ends the stream). Laid out in L lanes (`lanes[i]`, the count for position
    i's window), lane l is its l-th contiguous `size / L` positions, and each run of `group`
    output positions (a global batch) takes the next `group / L` of every lane's own keyed
    permutation, lane by lane — so the l-th `group / L` slice of every global batch comes
    from lane l alone: dealt to L processes, each reads one contiguous lane per window. A
    short last window is one lane. Needs `size % group == 0` and `group % L == 0`.
    """
    pos = np.asarray(positions, dtype=np.int64).ravel()
    if pos.size == 0:
        return pos.copy()
    g, q = np.divmod(pos, size)
    whole = np.full(pos.shape, size, dtype=np.int64)
    s = whole if parent_len is None else np.minimum(whole, parent_len - g * size)
    n_lanes = np.where(s == size, np.asarray(lanes, dtype=np.int64), 1)
    per = group // n_lanes
    j, r = np.divmod(q, group)
    lane, o = np.divmod(r, per)
    lane_len = s // n_lanes
    with np.errstate(over="ignore"):
        k = mix64((np.uint64(operator.index(key) & _M64) ^ g.astype(np.uint64))
                  + np.uint64(_GOLDEN))
        tag = (n_lanes.astype(np.uint64) << np.uint64(32)) | lane.astype(np.uint64)
        k = mix64((k ^ tag) + np.uint64(_GOLDEN))
    local = _permute_within(j * per + o, lane_len, k)
    return g * size + lane * lane_len + local


def permute_by_epoch(positions: np.ndarray, epochs: np.ndarray, n: int, seed: int) -> np.ndarray:
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


def apply_per_epoch(
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
