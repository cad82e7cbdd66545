"""A saved loader state: what it holds, and the checks it must pass before anything resumes.

A state is a few integers and the pipeline's description (see `Loader.get_state`). It comes
back from a checkpoint, a file a person may have edited, or another version of the code, so it
is checked whole, once, on `loader(state=...)` / `set_state()`, with an error that says which
field is wrong and why, rather than an IndexError (or a silent wrong batch) later.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from .errors import StateError

STATE_VERSION = 1
# Positions index int64 arrays in the samplers; past this they would wrap.
MAX_POSITION = 2**62
_COUNTS = ("position", "skip", "rows")


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
