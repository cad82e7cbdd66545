"""Mixing and concatenation as index arithmetic: output position → (input, position in it).

This module owns the answer to "which input does the k-th element of a mix come from, and
which of its elements is it?" (pure NumPy). Like the samplers, every answer is a function of
the position alone, so the position of each input is implied by the loader state's one
output position: nothing more is saved, and resume is exact.

`Dataset.mix` follows Grain's `MapDataset.mix`: weights are scaled to integers the way Grain
scales them (the smallest to 100), and position k goes to the input whose running count
grows at k (Grain's `_dataset_and_key_of_next_element`, vectorized here), a smooth
interleaving with period W = the sum of the integer weights, each input taking exactly its
weight's slots in every period. With a `seed`, the slots of period b are permuted by a keyed
permutation (per seed and b; a lookup's periods in one vectorized pass), so which input
comes next is random within a period, but the counts per period, hence the proportions,
are exact, and each input's elements are still taken in its own order (so a finite input
is read from its start, as without a seed).

A finite mix has Grain's length, `int(min(len_i / (w_i / W)))` over the finite inputs
(infinite ones bound nothing), cut shorter only where an input would be read past its end
(never seen with Grain's order; possible with a seed, where Grain's order is not kept).

`MixedIndex` composes the inputs' own index plans under a selection, with each input's
records offset into one record space (their files, or objects, laid end to end). Epochs
flow through: a repeat after the mix hands its epoch to every input, whose shuffles re-key
on it (Grain's "the n-th epoch of a concatenation is the n-th epoch of its inputs").
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .permutation import epoch_key, permute_by_epoch

MAX_PERIOD = 1 << 22  # sum of the integer weights: a seeded period is laid out whole
_SALT = 0x6D6978  # "mix": keys of a seeded period, apart from the shuffles' epoch keys


class PositionIndex(Protocol):
    """What a mix reads of each input (an `IndexPlan`, or a nested `MixedIndex`)."""

    @property
    def length(self) -> int | None: ...

    def lookup(self, positions: np.ndarray,
               epochs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]: ...


def proportions(weights: Sequence[float] | None, n: int) -> tuple[int, ...]:
    """Integer proportions of `weights` as Grain computes them (None: all equal)."""
    if n < 1:
        raise ValueError("mix() needs at least one dataset")
    if weights is None:
        return (1,) * n
    if isinstance(weights, (str, bytes)) or not all(
            isinstance(w, numbers.Real) and not isinstance(w, bool) for w in weights):
        raise TypeError(f"mix() weights must be numbers, one per dataset, got {weights!r}")
    ws = [float(w) for w in weights]
    if len(ws) != n:
        raise ValueError(f"mix() got {len(ws)} weights for {n} datasets")
    if not all(np.isfinite(w) and w > 0 for w in ws):
        raise ValueError(f"mix() weights must be finite and > 0, got {list(weights)}")
    scale = 100 / min(ws)
    props = tuple(int(w * scale) for w in ws)
    if sum(props) >= MAX_PERIOD:
        raise ValueError(f"mix() weights {list(weights)} are too uneven (the largest may be "
                         "at most ~40000 times the smallest)")
    return props


def _mul_div(a: np.ndarray, m: int, d: int) -> np.ndarray:
    """floor(a * m / d) for a >= 0 without overflow (m, d < 2^31)."""
    q, r = np.divmod(a, d)
    return q * m + (r * m) // d


def grain_select(k: np.ndarray, props: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(input, position in it) of mix positions `k` (Grain's interleaving, vectorized)."""
    k = np.asarray(k, dtype=np.int64)
    which = np.full(k.shape, -1, dtype=np.int64)
    key = np.zeros(k.shape, dtype=np.int64)
    open_ = np.ones(k.shape, dtype=bool)
    remaining = sum(props)
    cur, cur1 = k, k + 1
    for i, p in enumerate(props):
        nxt, nxt1 = _mul_div(cur, remaining - p, remaining), _mul_div(cur1, remaining - p,
                                                                      remaining)
        count1 = cur1 - nxt1
        hit = open_ & ((cur - nxt) != count1)
        which[hit] = i
        key[hit] = count1[hit] - 1
        open_ &= ~hit
        remaining -= p
        cur, cur1 = nxt, nxt1
    assert not open_.any()
    return which, key


def select(k: np.ndarray, props: Sequence[int],
           seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(input, position in it) of mix positions `k`: Grain's order, or with `seed` each
    period's slots dealt in a keyed random order (see the module docstring); either way
    each input's elements are taken in its own order."""
    k = np.asarray(k, dtype=np.int64)
    if seed is None:
        return grain_select(k, props)
    period = sum(props)
    b, r = np.divmod(k, period)
    periods, row = np.unique(b, return_inverse=True)  # few distinct periods per lookup
    which_all, rank_all = _periods(tuple(props), seed, periods)
    row = row.reshape(b.shape)
    which, key = which_all[row, r], rank_all[row, r]
    return which, b * np.asarray(props, dtype=np.int64)[which] + key


def _periods(props: tuple[int, ...], seed: int,
             periods: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The input of every slot of each seeded period in `periods` (one row each), and how
    many slots before it in its period took the same input (its rank: each input's
    elements are taken in order)."""
    period = sum(props)
    slots = permute_by_epoch(np.tile(np.arange(period, dtype=np.int64), len(periods)),
                             np.repeat(periods, period), period, epoch_key(seed, _SALT))
    which, _ = grain_select(slots, props)
    which = which.reshape(len(periods), period)
    rank = np.zeros_like(which)
    for i in range(len(props)):
        mine = which == i
        rank[mine] = (np.cumsum(mine, axis=1) - 1)[mine]
    return which, rank


def mix_length(lengths: Sequence[int | None], props: Sequence[int],
               seed: int | None) -> int | None:
    """Grain's length of a mix (where the shortest input's share of positions runs out),
    never past a position where a finite input would be read past its end (None: no input
    is finite)."""
    finite = [(i, n) for i, n in enumerate(lengths) if n is not None]
    if not finite:
        return None
    empty = [i for i, n in finite if n == 0]
    if empty:
        raise ValueError(f"mix() input {empty[0]} is empty: every input must have records")
    period = sum(props)
    full = min(n // props[i] for i, n in finite)  # whole periods that fit every input
    which, _ = select(full * period + np.arange(period, dtype=np.int64), props, seed)
    stop = period
    for i, n in finite:  # the slot where input i would be taken once more than it has
        slots = np.flatnonzero(which == i)
        left = n - full * props[i]
        if left < len(slots):
            stop = min(stop, int(slots[left]))
    # Grain's length (floats, as Grain computes it): the shortest input's share runs out.
    grain = int(min(n / (props[i] / period) for i, n in finite))
    return min(grain, full * period + stop)


def concat_select(k: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(input, position in it) of positions `k` of inputs laid end to end (`starts`: the
    prefix sums of their lengths, from 0)."""
    k = np.asarray(k, dtype=np.int64)
    which = np.searchsorted(starts, k, side="right") - 1
    return which, k - starts[which]


@dataclass(frozen=True)
class MixedIndex:
    """Inputs' index plans under a mix (`props`, `seed`) or a concatenation (`props` None),
    each input's records offset by `offsets[i]` into the one record space."""

    inputs: tuple[PositionIndex, ...]
    offsets: tuple[int, ...]
    props: tuple[int, ...] | None = None  # None: concatenate
    seed: int | None = None

    def __post_init__(self) -> None:
        lengths = [ix.length for ix in self.inputs]
        if self.props is None:
            infinite = [i for i, n in enumerate(lengths) if n is None]
            if infinite:
                raise ValueError(f"concatenate() input {infinite[0]} repeats forever: "
                                 "only finite datasets can be laid end to end (repeat the "
                                 "concatenation instead)")
            starts = np.concatenate([[0], np.cumsum([int(n or 0) for n in lengths])]).astype(
                np.int64)
            object.__setattr__(self, "_starts", starts)
            object.__setattr__(self, "_length", int(starts[-1]))
        else:
            object.__setattr__(self, "_length", mix_length(lengths, self.props, self.seed))

    @property
    def length(self) -> int | None:
        return self._length  # type: ignore[attr-defined]

    def choose(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input, position in it) of positions `k`."""
        if self.props is None:
            return concat_select(k, self._starts)  # type: ignore[attr-defined]
        return select(k, self.props, self.seed)

    def lookup(self, positions: np.ndarray,
               epochs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(records, epochs) of `positions`, each input's lookup given the incoming epochs."""
        pos = np.asarray(positions, dtype=np.int64).ravel()
        eps = np.zeros_like(pos) if epochs is None else np.asarray(epochs,
                                                                   dtype=np.int64).ravel()
        records, out_epochs = np.empty_like(pos), np.empty_like(pos)
        which, key = self.choose(pos)
        for i in np.unique(which).tolist():
            at = which == i
            rec, ep = self.inputs[i].lookup(key[at], eps[at])
            records[at] = rec + self.offsets[i]
            out_epochs[at] = ep
        return records, out_epochs
