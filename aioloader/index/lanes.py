"""Elastic resume of a stream-mode pipeline (filter, flat_map or pack): the remap (pure).

With a filter (or flat_map, or pack) the processes of a sharded run do not move in step:
each has consumed its own share of positions, and its state says where it is in its own
lane (`Shard` dealt in blocks). Moving to another process count therefore needs every
old process's place (`state.merge_states`), and the new lanes are:

- a *cut* C, a global position past everything any old process has seen (its window in
  progress, and for pack the window where its open block closed: `until`), rounded up to
  a round of both dealings;
- each old lane's *leftover*, its local positions from its state's window to the cut,
  given to new process `p % M`, resumed exactly as the old process would have (the first
  window's delivered elements, the open pack block's delivered rows, skipped);
- then the new process's own dealt lane from C on.

So every input position is consumed exactly once across the switch. `Lanes` is that
stream as an index op (new local position -> parent position); `restarts` are the
positions where a leftover begins (windows restart there, and packing restarts: a block
never spans two leftovers). A lane may itself be a `Lanes` (a run resumed elastically,
then moved again).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import StateError
from .sampling import Shard

MAX_DEPTH = 8  # lanes of lanes of ...: one level per elastic move still in progress
MAX_SEGMENTS = 4096


@dataclass(frozen=True)
class Segment:
    """Positions `[start, stop)` of an old lane, resumed at (`skip` elements of its first
    window, `rows` packed rows of the block starting there) already delivered."""

    lane: Shard | Lanes
    start: int
    stop: int
    skip: int = 0
    rows: int = 0


@dataclass(frozen=True)
class Lanes:
    """Index op: the leftovers of old lanes, then `main` (a dealt shard) from `main_start`
    on. `cut`: the global position where `main` starts (past every leftover)."""

    segments: tuple[Segment, ...]
    main: Shard
    main_start: int
    cut: int
    index_op = True  # `sampling.IndexPlan` takes it

    @property
    def head(self) -> int:
        """Positions of the leftovers (stops are clipped when the plan is made)."""
        return sum(s.stop - s.start for s in self.segments)

    def length(self, parent_len: int | None) -> int | None:
        n = self.main.length(parent_len)
        return None if n is None else self.head + max(0, n - self.main_start)

    def parent(self, positions: np.ndarray, epochs: np.ndarray, parent_len: int | None,
               chunk_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty_like(positions)
        lo = 0
        for s in self.segments:
            hi = lo + s.stop - s.start
            mask = (positions >= lo) & (positions < hi)
            if mask.any():
                out[mask] = s.lane.parent(positions[mask] - lo + s.start, epochs[mask],
                                          parent_len)[0]
            lo = hi
        mask = positions >= lo
        if mask.any():
            out[mask] = self.main.parent(positions[mask] - lo + self.main_start,
                                         epochs[mask], parent_len)[0]
        return out, epochs

    def restarts(self) -> dict[int, tuple[int, int]]:
        """`position: (skip, rows)` where each leftover begins, and where one begins inside
        a leftover that is itself lanes (its old process skipped there too)."""
        out: dict[int, tuple[int, int]] = {}
        lo = 0
        for s in self.segments:
            inner = s.lane.restarts() if isinstance(s.lane, Lanes) else {}
            out.update((lo + x - s.start, v) for x, v in inner.items()
                       if s.start < x < s.stop)
            own, got = (s.skip, s.rows), inner.get(s.start)
            if got is not None and s.skip <= got[0]:  # the state is at that old restart
                own = (got[0], max(got[1], s.rows if s.skip == got[0] else 0))
            out[lo] = own
            lo += s.stop - s.start
        return out

    def origins(self) -> list[int]:
        """Where windows restart their count (`origin`): at each leftover,
        at the origins inside a leftover that is itself lanes, and at the main lane."""
        out, lo = {self.head}, 0
        for s in self.segments:
            out.add(lo)
            if isinstance(s.lane, Lanes):
                out |= {lo + x - s.start for x in s.lane.origins() if s.start < x < s.stop}
            lo += s.stop - s.start
        return sorted(out)


def origin(position: int, cuts: Sequence[int]) -> int:
    """Where the windows of the region holding `position` start: 0, or the last of `cuts`
    (where a leftover lane begins after an elastic move) at or before it; a region's windows
    are `window` positions from there on (a task stays in one)."""
    return max((c for c in cuts if c <= position), default=0)


def group(lane: Shard | Lanes) -> int:
    """Global positions in one round of the lane's dealing."""
    shard = lane.main if isinstance(lane, Lanes) else lane
    return shard.block * shard.count


def local_at(lane: Shard | Lanes, cut: int) -> int:
    """The lane's local position where global position `cut` (a round boundary) falls."""
    if isinstance(lane, Lanes):
        return lane.head + cut // group(lane) * lane.main.block - lane.main_start
    return cut // group(lane) * lane.block


def reach(lane: Shard | Lanes, until: int, parent_len: int | None) -> int:
    """One past the largest global position among the lane's first `until` positions."""
    n = lane.length(parent_len)
    if n is not None:
        until = min(until, n)
    top = 0
    if until > 0:
        top = int(lane.parent(np.array([until - 1]), np.zeros(1, np.int64), parent_len)[0][0]) + 1
    return max(top, lane.cut) if isinstance(lane, Lanes) else top


@dataclass(frozen=True)
class Progress:
    """Where one old process was: its lane, and its state's position, skip, rows and
    `until` (one past the last local position its state depends on)."""

    lane: Shard | Lanes
    position: int
    skip: int
    rows: int
    until: int


def remap(old: Sequence[Progress], index: int, count: int, block: int, drop: bool,
          parent_len: int | None) -> Lanes:
    """Process `index` of `count`'s lanes (its shard dealt in blocks of `block`) after the
    old processes `old` (see the module docstring)."""
    cut = max((reach(p.lane, p.until, parent_len) for p in old), default=0)
    step = math.lcm(block * count, *(group(p.lane) for p in old))
    cut = -(-cut // step) * step
    segments = []
    for k, p in enumerate(old):
        if k % count != index:
            continue
        stop = local_at(p.lane, cut)
        n = p.lane.length(parent_len)
        if n is not None:
            stop = min(stop, n)
        if stop > p.position:
            segments.append(Segment(p.lane, p.position, stop, p.skip, p.rows))
    main = Shard(index, count, drop_remainder=drop, block=block)
    return Lanes(tuple(segments), main, cut // (block * count) * block, cut)


def check(lane: Shard | Lanes, index: int, count: int, block: int,
          parent_len: int | None) -> None:
    """A lane read from a state is one `remap` could have made for process `index` of
    `count` (dealt in blocks of `block`): else a `StateError` (the state was edited, or is
    of another dataset), rather than reads of records that are not there."""
    shard = lane.main if isinstance(lane, Lanes) else lane
    if (shard.index, shard.count, shard.block) != (index, count, block):
        raise StateError(f"loader state lane is process {shard.index} of {shard.count} "
                         f"(blocks of {shard.block}), not {index} of {count} (blocks of "
                         f"{block}): was it saved for another pipeline?")
    if isinstance(lane, Lanes):
        for s in lane.segments:
            inner = s.lane.main if isinstance(s.lane, Lanes) else s.lane
            check(s.lane, inner.index, inner.count, inner.block, parent_len)
            n = s.lane.length(parent_len)
            if n is not None and s.stop > n:
                raise StateError(f"loader state lane segment [{s.start}, {s.stop}) is past "
                                 f"the end of its lane ({n} positions): was it saved for "
                                 "another dataset?")


# -- JSON -------------------------------------------------------------------------------


def to_json(lane: Shard | Lanes) -> dict[str, Any]:
    if isinstance(lane, Shard):
        return {"shard": [lane.index, lane.count, lane.block, int(lane.drop_remainder)]}
    return {"segments": [[to_json(s.lane), s.start, s.stop, s.skip, s.rows]
                         for s in lane.segments],
            "main": to_json(lane.main)["shard"], "main_start": lane.main_start,
            "cut": lane.cut}


def from_json(obj: Any, depth: int = 0) -> Shard | Lanes:
    """A lane from `to_json`'s dict, checked (a `StateError` saying what is wrong)."""
    if depth > MAX_DEPTH or not isinstance(obj, Mapping):
        raise StateError(f"loader state 'lane' is not a lane description: {obj!r:.200}")
    if "shard" in obj:
        return _shard(obj["shard"])
    segs = obj.get("segments")
    if not isinstance(segs, list) or len(segs) > MAX_SEGMENTS:
        raise StateError(f"loader state 'lane' has no valid segments: {obj!r:.200}")
    out = []
    for s in segs:
        if not isinstance(s, list) or len(s) != 5:
            raise StateError(f"loader state lane segment {s!r:.200} is not "
                             "[lane, start, stop, skip, rows]")
        start, stop, skip, rows = (_nonneg(x, "segment") for x in s[1:])
        if stop <= start:
            raise StateError(f"loader state lane segment [{start}, {stop}) is empty")
        out.append(Segment(from_json(s[0], depth + 1), start, stop, skip, rows))
    return Lanes(tuple(out), _shard(obj.get("main")), _nonneg(obj.get("main_start"), "main"),
                 _nonneg(obj.get("cut"), "cut"))


def _nonneg(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or not 0 <= int(x) < 2**62:
        raise StateError(f"loader state lane {what} field {x!r:.100} is not an integer "
                         "in [0, 2**62)")
    return int(x)


def _shard(raw: Any) -> Shard:
    if not isinstance(raw, list) or len(raw) != 4:
        raise StateError(f"loader state lane shard {raw!r:.100} is not "
                         "[index, count, block, drop]")
    index, count, block, drop = (_nonneg(x, "shard") for x in raw)
    try:
        return Shard(index, count, drop_remainder=bool(drop), block=block)
    except ValueError as exc:
        raise StateError(f"loader state lane shard {raw!r}: {exc}") from None
