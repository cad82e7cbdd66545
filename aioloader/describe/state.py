"""`LoaderState`: where the consumer is in the stream, the one owner of that place.

A state is a few integers and the pipeline's description: the output position after the
last item delivered, plus, when filter or pack make batches uneven, how many elements
(`skip`) or packed rows (`rows`) of the task at that position were already delivered; the
task size (`unit`) and the process count it was saved with; the pipeline's fingerprint. It
is JSON as `to_json()` writes it (the dict `Loader.get_state()` returns). A pack state also
says where its open block closed (`until`), and a run resumed on another process count its
lane (`lane`, `aioloader.index.lanes`): what an elastic move of a stream-mode run needs.
A bucket_by_length state adds, per bucket, how many of its elements from the position on
were already delivered (`buckets`, `aioloader.elements.bucketing`).

It comes back from a checkpoint, a file a person may have edited, or another version of the
code, so `LoaderState.from_json` checks it whole, once, with an error that says which field
is wrong and why, rather than an IndexError (or a silent wrong batch) later. `resume_as`
checks it against the pipeline that resumes it and moves it to another process count
(elastic resume): a batch-mode state alone (every process is at the same step), a
stream-mode one merged with the other processes' (`merge_states`). Everything here is pure.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import StateError
from ..index import lanes as lanes_mod
from ..urls import redact

STATE_VERSION = 1
# Positions index int64 arrays in the samplers; past this they would wrap.
MAX_POSITION = 2**62
_COUNTS = ("position", "skip", "rows")
MAX_BUCKETS = 1 << 16  # more counts than any bucket_by_length() could have
_OLD_BLOCK_SHUFFLE = re.compile(r"shuffle\(seed=-?\d+, block\)")  # chunk-counted window


def _layout(state: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The optional `layout`: `[[end, count], ...]`, ends increasing, counts >= 1."""
    raw = state.get("layout", [])
    ok = isinstance(raw, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2
        and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in p)
        for p in raw)
    pairs = [(int(e), int(c)) for e, c in raw] if ok else []
    if not ok or any(not 0 <= e < MAX_POSITION or c < 1 for e, c in pairs) or \
            [e for e, _ in pairs] != sorted(e for e, _ in pairs):
        raise StateError(f"loader state 'layout' must be a list of [end, process_count] "
                         f"pairs with increasing ends, got {raw!r}")
    return pairs


def _int(state: Mapping[str, Any], key: str, lo: int, default: int | None = None) -> int:
    value = state.get(key, default)
    if value is None:
        raise StateError(f"loader state has no {key!r}: pass the dict get_state() returned")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise StateError(f"loader state {key!r} must be an integer, got {value!r} "
                         f"({type(value).__name__})")
    value = int(value)
    if not lo <= value < MAX_POSITION:
        raise StateError(f"loader state {key!r} = {value} is outside [{lo}, 2**62)")
    return value


def _buckets(state: Mapping[str, Any]) -> list[int]:
    """The optional `buckets`: a list of whole numbers >= 0, one per bucket."""
    raw = state.get("buckets", [])
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_BUCKETS or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool)
            and 0 <= int(x) < MAX_POSITION for x in raw):
        raise StateError(f"loader state 'buckets' must be a list of counts >= 0, one per "
                         f"bucket of bucket_by_length(), got {raw!r:.200}")
    return [int(x) for x in raw]


def check_lane(lane: Any, depth: int = 0) -> None:
    """A `lane` field: a lane (`lanes.to_json`), or, until its run's plan is made, the
    merged state it moves from and the process's index (a `StateError` if neither)."""
    if isinstance(lane, Mapping) and "moved" in lane:
        if depth > lanes_mod.MAX_DEPTH:
            raise StateError("loader state 'lane' is nested too deep")
        moved = check_state(lane["moved"], depth + 1)
        index = lane.get("index")
        if not moved["lanes"] or isinstance(index, bool) or not isinstance(index, int) or \
                index < 0:
            raise StateError(f"loader state 'lane' {lane!r:.200} is not a moved lane")
    else:
        lanes_mod.from_json(lane)


def check_state(state: Any, depth: int = 0) -> dict[str, Any]:
    """The state's fields, type- and range-checked; a `StateError` naming the first bad one.

    What depends on the pipeline (its fingerprint, the batch size, where the stream ends) is
    checked by the loader against its own.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is the dict get_state() returned, not "
                         f"{type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise StateError(f"loader state version {state.get('version')!r} is not "
                         f"{STATE_VERSION}: it was saved by another aioloader version")
    pipeline = state.get("pipeline")
    if not isinstance(pipeline, (list, tuple)) or not all(isinstance(x, str) for x in pipeline):
        raise StateError("loader state has no 'pipeline' (a list of the pipeline's steps): "
                         "pass the dict get_state() returned")
    out: dict[str, Any] = {k: _int(state, k, 0, None if k == "position" else 0)
                           for k in _COUNTS}
    out["unit"] = _int(state, "unit", 1)
    out["process_count"] = _int(state, "process_count", 1, 1)
    out["pipeline"] = list(pipeline)
    out["layout"] = _layout(state)
    out["until"] = _int(state, "until", 0, 0)
    out["buckets"] = _buckets(state)
    out["lane"] = state.get("lane")
    if out["lane"] is not None:
        check_lane(out["lane"], depth)  # checked here, used by the plan
    raw = state.get("lanes", [])
    if not isinstance(raw, (list, tuple)) or len(raw) > lanes_mod.MAX_SEGMENTS or \
            (raw and len(raw) != out["process_count"]):
        raise StateError(f"loader state 'lanes' must be a list of the {out['process_count']} "
                         f"processes' places (merge_states), got {raw!r:.200}")
    out["lanes"] = [_lane_place(d, depth) for d in raw]
    return out


def _lane_place(d: Any, depth: int) -> dict[str, Any]:
    """One process's place in a merged state (`merge_states`), checked."""
    if not isinstance(d, Mapping):
        raise StateError(f"loader state 'lanes' entry {d!r:.100} is not a dict")
    out: dict[str, Any] = {k: _int(d, k, 0, 0) for k in (*_COUNTS, "until")}
    if d.get("buckets"):
        out["buckets"] = _buckets(d)
    if d.get("lane") is not None:
        check_lane(d["lane"], depth)
        out["lane"] = d["lane"]
    return out


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The states of all processes of one run (process i's at index i) as one state, which
    resumes on any process count: elastic resume of a pipeline with filter, flat_map or
    pack needs every process's place (each has consumed its own share). On the same count,
    process i takes its own place; a batch-mode pipeline uses process 0's (all are alike).
    """
    checked = [check_state(s) for s in states]
    if not checked:
        raise StateError("merge_states() needs the state of every process, got none")
    first = checked[0]
    for i, s in enumerate(checked):
        if s["lanes"]:
            raise StateError(f"state {i} is already merged")
        if s["process_count"] != len(checked):
            raise StateError(f"state {i} was saved by one of {s['process_count']} processes, "
                             f"but {len(checked)} states were given: pass every process's, "
                             "in process order")
        for key in ("pipeline", "unit", "layout"):
            if s[key] != first[key]:
                raise StateError(f"states 0 and {i} differ in {key!r}: they are not of one run")
    out = dict(states[0])
    out["lanes"] = [{k: s[k] for k in (*_COUNTS, "until")} | (
        {"lane": s["lane"]} if s["lane"] is not None else {}) | (
        {"buckets": s["buckets"]} if s["buckets"] else {}) for s in checked]
    return out


def check_position(state: Mapping[str, Any], length: int | None, batch_mode: bool,
                   cuts: Sequence[int] = ()) -> None:
    """A position the stream can resume at: on a unit (batch or window) boundary (or where
    a leftover lane begins after an elastic move: `cuts`), or at the very end of a finite
    stream, and never past the end of its last (partial) batch."""
    position, unit = state["position"], state["unit"]
    # After a last partial batch the state says the position its whole batch would end at.
    if length is not None and position > length and (position % unit or
                                                      position - unit >= length):
        raise StateError(f"loader state position {position} is past the end of this "
                         f"pipeline's stream ({length} positions): was it saved for another "
                         "dataset?")
    if (position - max((c for c in cuts if c <= position), default=0)) % unit and \
            position != length:
        what = "batch" if batch_mode else "window"
        raise StateError(f"loader state position {position} is not on a {what} boundary "
                         f"(a multiple of {unit}): states from get_state() always are")
    if batch_mode and (state["skip"] or state["rows"] or state.get("buckets")):
        raise StateError("loader state has 'skip'/'rows' set, which only a pipeline with "
                         "filter() or pack() saves: was it saved for another pipeline?")


@dataclass(frozen=True)
class LoaderState:
    """The consumer's place in the stream (see the module docstring); immutable."""

    position: int = 0
    skip: int = 0
    rows: int = 0
    unit: int = 1
    process_count: int = 1
    pipeline: tuple[str, ...] = ()
    # Earlier process counts of this run, as (global position it ran to, count) pairs: a
    # dealt block shuffle lays a window out by the count that began it (`blocks.Windows`).
    layout: tuple[tuple[int, int], ...] = ()
    # Pack: one past the window where the open block closed (0: the state's own window).
    until: int = 0
    lane: Any = None  # this run's lane after an elastic stream-mode resume (`lanes.to_json`)
    lanes: tuple[dict, ...] = ()  # a merged state: every process's place (`merge_states`)
    # bucket_by_length: per bucket, its elements from `position` on already delivered
    buckets: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, state: Any) -> LoaderState:
        """A saved state (`get_state()`'s dict), checked field by field (`StateError`)."""
        d = check_state(state)
        return cls(d["position"], d["skip"], d["rows"], d["unit"], d["process_count"],
                   tuple(d["pipeline"]), tuple(d["layout"]), d["until"], d["lane"],
                   tuple(d["lanes"]), tuple(d["buckets"]))

    def to_json(self) -> dict[str, Any]:
        out = {"version": STATE_VERSION, "position": self.position, "skip": self.skip,
               "rows": self.rows, "unit": self.unit, "process_count": self.process_count,
               "pipeline": list(self.pipeline)}
        if self.layout:  # only after an elastic resume: older states stay as they were
            out["layout"] = [list(p) for p in self.layout]
        if self.until:  # fields that older states lack appear only when set
            out["until"] = self.until
        if self.lane is not None:
            out["lane"] = self.lane
        if self.lanes:
            out["lanes"] = [dict(d) for d in self.lanes]
        if any(self.buckets):
            out["buckets"] = list(self.buckets)
        return out

    def at(self, position: int, skip: int = 0, rows: int = 0, until: int = 0,
           buckets: tuple[int, ...] = ()) -> LoaderState:
        """This state moved to another place in the same stream."""
        return replace(self, position=position, skip=skip, rows=rows, until=until,
                       buckets=buckets)

    def resume_as(self, pipeline: Sequence[str], unit: int, process_count: int,
                  batch_mode: bool, process_index: int = 0) -> LoaderState:
        """This state for the pipeline about to resume it (its fingerprint, its task unit and
        process count), or a `StateError` saying why it cannot be.

        Fingerprints are compared redacted: states saved before URLs were redacted in the
        fingerprint still resume, and so does a URL signed again since (the signature is not
        the pipeline). Elastic resume: every global batch is the next unit*count positions of
        the stream (block-dealt shards), so the step count carries over to another process
        count when the global batch is the same, and the old count is added to `layout` (a dealt
        block shuffle finishes the window in progress in the old count's lanes). A
        stream-mode pipeline keeps the saved window, whatever its own default.
        """
        if [redact(ln) for ln in self.pipeline] != list(pipeline):
            if any(_OLD_BLOCK_SHUFFLE.fullmatch(ln) for ln in self.pipeline):
                raise StateError(
                    "this state was saved by an aioloader whose block shuffle permuted chunks "
                    "(window= counted chunks); the block shuffle now deals blocks of "
                    "block_bytes in windows of window_bytes, another order, so the state "
                    "cannot resume exactly: start the run (or the epoch) without it")
            raise StateError(redact("this state was saved by a different pipeline:\n  "
                                    + " -> ".join(self.pipeline) + "\nis not\n  "
                                    + " -> ".join(pipeline)))
        buckets = any(ln.startswith("bucket_by_length(") for ln in pipeline)
        if not buckets and (self.buckets or any(d.get("buckets") for d in self.lanes)):
            raise StateError("loader state has 'buckets', which only a pipeline with "
                             "bucket_by_length() saves: was it saved for another pipeline?")
        if not batch_mode:
            return self._stream_as(tuple(pipeline), process_count, process_index)
        moved = replace(self, lanes=())  # process 0's place is every process's
        return moved._batch_as(tuple(pipeline), unit, process_count)

    def _batch_as(self, pipeline: tuple[str, ...], unit: int, process_count: int
                  ) -> LoaderState:
        if self.process_count != process_count:
            if self.skip or self.unit * self.process_count != unit * process_count:
                raise StateError(
                    f"state from {self.process_count} processes cannot resume on "
                    f"{process_count}: elastic resume needs the same global batch size"
                )
            if self.position % self.unit:
                raise StateError(f"loader state position {self.position} is not on a batch "
                                 f"boundary (a multiple of {self.unit}): it cannot move to "
                                 f"{process_count} processes")
            ran_to = self.position * self.process_count  # global position, batch boundary
            layout = (*self.layout, (ran_to, self.process_count))
            if len(layout) > 1 and layout[-2][0] == ran_to:  # that count ran no step
                layout = (*layout[:-2], (ran_to, layout[-2][1]))
            return replace(self, position=self.position // self.unit * unit, unit=unit,
                           process_count=process_count, pipeline=tuple(pipeline),
                           layout=layout)
        if self.unit != unit:
            raise StateError(f"state was saved with batch size {self.unit}, not {unit}")
        return replace(self, pipeline=tuple(pipeline))

    def _stream_as(self, pipeline: tuple[str, ...], process_count: int,
                   process_index: int) -> LoaderState:
        """Stream mode (the state's window is kept): a merged state gives this process its
        place, or, on another process count, is moved (the plan makes the lanes)."""
        buckets = any(ln.startswith("bucket_by_length(") for ln in pipeline)
        if not self.lanes:
            if self.process_count != process_count and buckets:
                raise StateError(
                    f"a bucket_by_length() state from {self.process_count} processes cannot "
                    f"resume on {process_count}: each process's buckets hold elements of its "
                    f"own share, so it resumes only on the same process count; resume on "
                    f"{self.process_count} processes (or start the epoch afresh)")
            if self.process_count != process_count:
                raise StateError(
                    f"state from {self.process_count} processes cannot resume on "
                    f"{process_count} on its own: with filter, flat_map or pack each process "
                    "has consumed its own share, so elastic resume needs every process's "
                    "state: pass aioloader.merge_states([state_0, ..., state_n]) (the Orbax "
                    "LoaderRestore does it)")
            return replace(self, pipeline=pipeline)
        if self.process_count == process_count:
            d = self.lanes[process_index]
            return replace(self, pipeline=pipeline, lanes=(), position=d["position"],
                           skip=d["skip"], rows=d["rows"], until=d["until"],
                           lane=d.get("lane"), buckets=tuple(d.get("buckets", ())))
        if buckets:
            raise StateError("a bucket_by_length() state cannot move to another process "
                             "count: each process's buckets hold elements of its own share, "
                             f"which no other process reads; resume on {self.process_count} "
                             "processes (or start the epoch afresh)")
        if self.layout:
            raise StateError("a dealt block shuffle with filter, flat_map or pack cannot "
                             "move to another process count; resume on "
                             f"{self.process_count} processes")
        if any(ln.startswith("pack(") for ln in pipeline) and \
                any(d["rows"] and not d["until"] for d in self.lanes):
            raise StateError("this pack() state was saved by an aioloader that did not record "
                             "where packing blocks end, so it cannot move to another "
                             f"process count; resume on {self.process_count} processes")
        return replace(self, pipeline=pipeline, process_count=process_count, position=0,
                       skip=0, rows=0, until=0, lanes=(),
                       lane={"moved": self.to_json(), "index": process_index})

    @property
    def moved(self) -> bool:
        """Whether this process's lanes are still to be made (by the plan)."""
        return isinstance(self.lane, Mapping) and "moved" in self.lane

    def check_position(self, length: int | None, batch_mode: bool,
                       cuts: Sequence[int] = ()) -> None:
        """`check_position` for this state (a `StateError` if the stream cannot resume
        here)."""
        check_position({"position": self.position, "skip": self.skip, "rows": self.rows,
                        "buckets": self.buckets,
                        "unit": self.unit}, length, batch_mode, cuts)
