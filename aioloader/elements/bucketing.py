"""Bucketing by length (pure): what `bucket_by_length` means, and the buckets' decisions
with a resume place of a few integers.

tf.data's `bucket_by_sequence_length`: an element goes to bucket `b`, the number of
`boundaries` at or below `length_fn(element)` (bucket 0 below the first, the last at or
above the last), and a bucket emits its `batch_sizes[b]` elements, padded as one batch, as
soon as it holds that many. At the end of the data the partial buckets are emitted in
bucket order, or dropped with `drop_remainder`. Within a bucket elements keep their order.

`Buckets` makes those decisions for any items, given in stream order, each with its place
in the stream (a tag). Its resume place after each batch is not the pending elements but
where to recompute them from: `R`, the earliest element still pending (or, none pending,
the place after the last element), and per bucket `k[b]`, how many of its elements from
`R` on were already emitted. Every element before `R` has been emitted, and a bucket emits
in order, so those `k[b]` are its first elements from `R` on: replaying the stream from
`R` with `Buckets(..., skips=k)` drops them and refills every bucket with exactly what it
held, and no bucket fills before the place the state was taken (none was full there).
The batches from then on are the same, bit for bit, whatever fed the stream.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arguments import flag, whole
from ..errors import StateError
from .padding import Rule, pad_rules
from .padding import describe as describe_padding


@dataclass(frozen=True)
class BucketOp:
    """`bucket_by_length()`: elements grouped into batches by `length_fn` (see the module
    docstring), padded as `batch(pad=...)` pads (`rules`)."""

    length_fn: Callable[[Any], int]
    boundaries: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    pad: Any = True
    pad_value: Any = 0
    truncate: bool = False
    masks: bool = True
    drop_remainder: bool = False
    rules: Rule = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.length_fn):
            raise TypeError(f"bucket_by_length() length_fn must be a function of an element, "
                            f"got {type(self.length_fn).__name__}")
        bounds, sizes = check_buckets(self.boundaries, self.batch_sizes)
        object.__setattr__(self, "boundaries", bounds)
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "truncate", flag(self.truncate, "bucket_by_length truncate"))
        object.__setattr__(self, "masks", flag(self.masks, "bucket_by_length masks"))
        object.__setattr__(self, "drop_remainder",
                           flag(self.drop_remainder, "bucket_by_length drop_remainder"))
        object.__setattr__(self, "rules", pad_rules(self.pad, self.pad_value, self.truncate,
                                                    "bucket_by_length"))

    @property
    def num_buckets(self) -> int:
        return len(self.batch_sizes)

    def describe(self) -> str:
        name = getattr(self.length_fn, "__qualname__", None) or type(self.length_fn).__name__
        return (f"bucket_by_length({name}, boundaries={list(self.boundaries)}, "
                f"batch_sizes={list(self.batch_sizes)}"
                f"{', drop_remainder' if self.drop_remainder else ''}"
                f"{describe_padding(self.pad, self.pad_value, self.truncate, self.masks)})")


def check_buckets(boundaries: Any, batch_sizes: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`boundaries` (whole numbers >= 1, strictly increasing) and `batch_sizes` (one more,
    each >= 1) as tuples, or an error naming the argument."""
    boundaries, batch_sizes = (_listed(v, name) for v, name in (
        (boundaries, "boundaries"), (batch_sizes, "batch_sizes")))
    bounds = tuple(whole(b, f"bucket_by_length() boundaries[{i}]", 1)
                   for i, b in enumerate(boundaries))
    if not bounds:
        raise ValueError("bucket_by_length() boundaries must name at least one length (with "
                         "none, every element is in one bucket: use batch(pad=...))")
    for i in range(1, len(bounds)):
        if bounds[i] <= bounds[i - 1]:
            raise ValueError(f"bucket_by_length() boundaries must be strictly increasing, but "
                             f"boundaries[{i}] = {bounds[i]} follows {bounds[i - 1]}")
    if len(batch_sizes) != len(bounds) + 1:
        raise ValueError(f"bucket_by_length() batch_sizes must have len(boundaries) + 1 = "
                         f"{len(bounds) + 1} entries (one per bucket: below {bounds[0]}, ..., "
                         f"{bounds[-1]} and above), got {len(batch_sizes)}")
    sizes = tuple(whole(s, f"bucket_by_length() batch_sizes[{i}]", 1)
                  for i, s in enumerate(batch_sizes))
    return bounds, sizes


def _listed(value: Any, name: str) -> list:
    """`value`, a 1-D sequence (a list, a tuple, a NumPy array...), as a list."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist() if value.dtype.kind in "iu" else list(value)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"bucket_by_length() {name} must be a list of integers (or a 1-D "
                        f"array), got {type(value).__name__}"
                        + (f" of shape {value.shape}" if isinstance(value, np.ndarray) else ""))
    return list(value)


def bucket_of(length: int, boundaries: Sequence[int]) -> int:
    """The bucket of an element of `length`: how many boundaries are at or below it."""
    return bisect.bisect_right(boundaries, length)


Place = tuple[Any, tuple[int, ...]]  # (where to replay from: a tag, skips per bucket)


class Buckets:
    """The buckets' decisions over a stream of items (see the module docstring): `add`
    each item with its tag, its bucket and the tag just after it; `finish` at the end.
    Each returns the batches it emits as `(bucket, items, place)`, `place` being where a
    replay resumes after that batch (`Buckets(..., skips=place[1])` fed from `place[0]`).

    A pending item costs its own entry, however many buckets there are: a bucket emits all
    it holds at once, so the earliest pending item is always the first of some bucket (its
    head), and only heads need the per-bucket counts at their place. The earliest head's
    counts are kept whole (`_base`); every later head keeps only what was given to each
    bucket since the head before it, sparse (at most one entry per bucket given any), as
    the stream after the last head does (`_since`).
    """

    def __init__(self, batch_sizes: Sequence[int], drop_remainder: bool = False,
                 skips: Sequence[int] = ()) -> None:
        n = len(batch_sizes)
        self.sizes = list(batch_sizes)
        self.drop = drop_remainder
        self.skips = list(skips) or [0] * n
        if len(self.skips) != n:
            raise StateError(f"loader state 'buckets' has {len(self.skips)} counts, but "
                             f"bucket_by_length() has {n} buckets: was it saved for another "
                             "pipeline?")
        self._owed = sum(self.skips)  # skips still to come
        self.seen = [0] * n  # items given to each bucket (skipped ones included)
        self.emitted = [0] * n  # items each bucket emitted (skipped ones included)
        self._pending: list[deque] = [deque() for _ in range(n)]  # (item, tag)
        self._base = [0] * n  # `seen` just before the earliest head (or now, none pending)
        self._since: dict[int, int] = {}  # given per bucket since the last head's place
        # a later head's counts: what was given to each bucket since the head before it
        self._delta: list[dict[int, int] | None] = [None] * n
        self._prev: list[int] = [-1] * n  # heads in stream order, linked both ways
        self._next: list[int] = [-1] * n
        self._first = self._last = -1

    @property
    def pending(self) -> int:
        return sum(map(len, self._pending))

    def add(self, item: Any, tag: Any, bucket: int, after: Any) -> list[tuple[int, list, Place]]:
        if self.skips[bucket]:  # emitted before the place this run resumed at
            self._count(bucket)
            self.skips[bucket] -= 1
            self._owed -= 1
            self.emitted[bucket] += 1
            return []
        queue = self._pending[bucket]
        if not queue:
            self._push_head(bucket)
        self._count(bucket)
        queue.append((item, tag))
        if len(queue) < self.sizes[bucket]:
            return []
        if self._owed:  # a replay fills no bucket before the place it resumed at
            raise StateError(self._unconsumed(f"bucket {bucket} fills before them"))
        return [self._emit(bucket, after)]

    def finish(self, after: Any) -> list[tuple[int, list, Place]]:
        """The partial buckets, in bucket order (none with drop_remainder)."""
        if self._owed:
            raise StateError(self._unconsumed("the data ends before them"))
        if self.drop:
            return []
        return [self._emit(b, after) for b, q in enumerate(self._pending) if q]

    def clear(self) -> None:
        for q in self._pending:
            q.clear()

    def _unconsumed(self, why: str) -> str:
        left = {b: k for b, k in enumerate(self.skips) if k}
        return (f"loader state 'buckets' says {sum(left.values())} more elements of buckets "
                f"{sorted(left)[:8]} were delivered, but {why}: the state was edited or "
                "saved for other data; resume from a state get_state() returned")

    def _count(self, bucket: int) -> None:
        self.seen[bucket] += 1
        self._since[bucket] = self._since.get(bucket, 0) + 1

    def _push_head(self, bucket: int) -> None:
        """`bucket`'s next item is its first pending one: it becomes the latest head."""
        if self._last < 0:
            _fold(self._base, self._since)
            self._first = bucket
        else:
            self._delta[bucket] = self._since
            self._next[self._last] = bucket
            self._prev[bucket] = self._last
        self._since = {}
        self._last = bucket

    def _pop_head(self, bucket: int) -> None:
        """`bucket` emitted all it held: its head goes, its counts to the head after it."""
        prev, nxt = self._prev[bucket], self._next[bucket]
        delta = self._delta[bucket] or {}
        self._prev[bucket] = self._next[bucket] = -1
        self._delta[bucket] = None
        if prev < 0:  # the earliest: the next head's place is the new base
            later = self._delta[nxt] if nxt >= 0 else self._since
            _fold(self._base, later or {})
            if nxt >= 0:
                self._delta[nxt] = None
            else:
                self._since = {}
            self._first = nxt
        else:
            self._next[prev] = nxt
            if nxt >= 0:
                self._delta[nxt] = _merged(delta, self._delta[nxt] or {})
            else:
                self._since = _merged(delta, self._since)
        if nxt >= 0:
            self._prev[nxt] = prev
        else:
            self._last = prev

    def _emit(self, bucket: int, after: Any) -> tuple[int, list, Place]:
        queue = self._pending[bucket]
        items = [x[0] for x in queue]
        self.emitted[bucket] += len(queue)
        queue.clear()
        self._pop_head(bucket)
        return bucket, items, self.place(after)

    def place(self, after: Any) -> Place:
        """Where a replay resumes now: the earliest pending item's tag and the skips from
        there (`after` and the skips still to come, none pending)."""
        if self._first < 0:
            return after, tuple(self.skips)
        tag = self._pending[self._first][0][1]
        return tag, tuple(e - s + k for e, s, k in zip(self.emitted, self._base, self.skips))


def _fold(base: list[int], counts: dict[int, int]) -> None:
    for b, k in counts.items():
        base[b] += k


def _merged(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    """The sum of two sparse counts (the smaller added into the larger)."""
    if len(a) > len(b):
        a, b = b, a
    for k, v in a.items():
        b[k] = b.get(k, 0) + v
    return b
