"""`LoaderState`: where the consumer is in the stream, the one owner of that place.

A state is a few integers and the pipeline's description: the output position after the
last item delivered, plus, when filter or pack make batches uneven, how many elements
(`skip`) or packed rows (`rows`) of the task at that position were already delivered; the
task size (`unit`) and the process count it was saved with; the pipeline's fingerprint. It
is JSON as `to_json()` writes it (the dict `Loader.get_state()` returns).

It comes back from a checkpoint, a file a person may have edited, or another version of the
code, so `LoaderState.from_json` checks it whole, once, with an error that says which field
is wrong and why, rather than an IndexError (or a silent wrong batch) later. `resume_as`
checks it against the pipeline that resumes it and moves it to another process count
(elastic resume). Everything here is pure.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .errors import StateError
from .urls import redact

STATE_VERSION = 1
# Positions index int64 arrays in the samplers; past this they would wrap.
MAX_POSITION = 2**62
_COUNTS = ("position", "skip", "rows")
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


def check_state(state: Any) -> dict[str, Any]:
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
    return out


def check_position(state: Mapping[str, int], length: int | None, batch_mode: bool) -> None:
    """A position the stream can resume at: on a unit (batch or window) boundary, or at the
    very end of a finite stream, and never past the end of its last (partial) batch."""
    position, unit = state["position"], state["unit"]
    # After a last partial batch the state says the position its whole batch would end at.
    if length is not None and position > length and (position % unit or
                                                      position - unit >= length):
        raise StateError(f"loader state position {position} is past the end of this "
                         f"pipeline's stream ({length} positions): was it saved for another "
                         "dataset?")
    if position % unit and position != length:
        what = "batch" if batch_mode else "window"
        raise StateError(f"loader state position {position} is not on a {what} boundary "
                         f"(a multiple of {unit}): states from get_state() always are")
    if batch_mode and (state["skip"] or state["rows"]):
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

    @classmethod
    def from_json(cls, state: Any) -> LoaderState:
        """A saved state (`get_state()`'s dict), checked field by field (`StateError`)."""
        d = check_state(state)
        return cls(d["position"], d["skip"], d["rows"], d["unit"], d["process_count"],
                   tuple(d["pipeline"]), tuple(d["layout"]))

    def to_json(self) -> dict[str, Any]:
        out = {"version": STATE_VERSION, "position": self.position, "skip": self.skip,
               "rows": self.rows, "unit": self.unit, "process_count": self.process_count,
               "pipeline": list(self.pipeline)}
        if self.layout:  # only after an elastic resume: older states stay as they were
            out["layout"] = [list(p) for p in self.layout]
        return out

    def at(self, position: int, skip: int = 0, rows: int = 0) -> LoaderState:
        """This state moved to another place in the same stream."""
        return replace(self, position=position, skip=skip, rows=rows)

    def resume_as(self, pipeline: Sequence[str], unit: int, process_count: int,
                  batch_mode: bool) -> LoaderState:
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
        if self.process_count != process_count:
            if not batch_mode or self.skip or self.unit * self.process_count != \
                    unit * process_count:
                raise StateError(
                    f"state from {self.process_count} processes cannot resume on "
                    f"{process_count}: elastic resume needs batch() without filter/pack "
                    "and the same global batch size"
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
        if self.unit != unit and batch_mode:
            raise StateError(f"state was saved with batch size {self.unit}, not {unit}")
        return replace(self, pipeline=tuple(pipeline))

    def check_position(self, length: int | None, batch_mode: bool) -> None:
        """`check_position` for this state (a `StateError` if the stream cannot resume
        here)."""
        check_position({"position": self.position, "skip": self.skip, "rows": self.rows,
                        "unit": self.unit}, length, batch_mode)
