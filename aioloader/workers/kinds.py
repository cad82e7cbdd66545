"""What `executor=` names: the kinds of executor a loader can run its tasks on, and the one
function that opens the executor for a loader (`open_executor`).

An `ExecutorKind` opens an `Executor` for a pipeline and a worker count; the runtime holds
the executor it gets and never asks which kind made it. A name ("processes", "threads",
"ray") is looked up here, its module imported on first use, so that `import aioloader`
loads none of them (and never Ray); a kind object given by the user (one configured with
options of its own, say) is used as it is. workers=0 runs tasks on one thread of this
process (`Inline`) whatever kind is named: there is nothing to place elsewhere.

A kind may also say what it needs done when a loader that will use it is made, before its
files open (`prepare`): processes check that the transforms pickle and start the worker
server; threads need nothing. A kind without a `prepare` needs nothing either.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from .executor import Executor
from .inline import Inline
from .messages import Pipeline

__all__ = ["KINDS", "ExecutorKind", "kind_named", "open_executor", "prepare"]


class ExecutorKind(Protocol):
    """Opens executors of one kind (processes, threads, Ray actors...).

    A kind may also have `prepare(dataset)`, called when a loader that will use it is made,
    before its files open (processes check that the transforms pickle and start their
    worker server there); a kind without one needs nothing done early.
    """

    name: str  # shown in the loader's graph and stats

    def open(self, pipeline: Pipeline, workers: int, *, slots: int, slot_size: int,
             lanes: int | None, first_in_parent: bool) -> Executor:
        """An executor running `pipeline`'s tasks on `workers` (≥ 1) workers; `slots`,
        `slot_size`: the result slots it may lend; `lanes`: with workers="auto", the
        tuner's first worker count (`workers` is then the most); `first_in_parent`: the
        first tasks may run in this process while the workers start."""


# name -> (module, attribute): the kind object, imported on first use
KINDS = {"processes": (".pool", "PROCESSES"), "threads": (".threads", "THREADS"),
         "ray": (".ray", "RAY")}


def kind_named(kind: str | ExecutorKind) -> ExecutorKind:
    """The executor kind `kind` names (or `kind` itself, an object)."""
    if not isinstance(kind, str):
        return kind
    try:
        module, attr = KINDS[kind]
    except KeyError:
        raise ValueError(f"no executor named {kind!r}; choose one of "
                         f"{', '.join(map(repr, KINDS))}") from None
    found: ExecutorKind = getattr(importlib.import_module(module, __package__), attr)
    return found


def prepare(kind: str | ExecutorKind, dataset: Any) -> None:
    """Before `dataset`'s loader opens its files: what `kind` needs done early (its optional
    `prepare(dataset)`: processes raise a clear error for a transform that cannot be pickled,
    and start the worker server, which loads while the files open)."""
    early = getattr(kind_named(kind), "prepare", None)
    if early is not None:
        early(dataset)


def open_executor(pipeline: Pipeline, workers: int, *, slots: int, slot_size: int = 32 << 20,
                  lanes: int | None = None, first_in_parent: bool = False,
                  kind: str | ExecutorKind = "processes") -> Executor:
    """The executor of `kind` for `workers` workers, or this process with 0 (`Inline`);
    `lanes`: with workers="auto", the tuner's first worker count (`workers`: the most)."""
    if workers == 0:
        return Inline(pipeline, slots=slots, slot_size=slot_size, lanes=lanes)
    return kind_named(kind).open(pipeline, workers, slots=slots, slot_size=slot_size,
                                 lanes=lanes, first_in_parent=first_in_parent)
