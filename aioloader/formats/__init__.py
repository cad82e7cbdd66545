"""Record formats: how a file's chunk table is built and how a chunk's bytes become records.

Everything above this layer (opening, the record table, the planner, the workers) works on
one chunk table per file (`arrayrecord.FileIndex`: chunk offsets, records per chunk,
decoded sizes) and on chunks as byte ranges; what differs between formats is only how that
table is built from a file's bytes and how a chunk's bytes decode. Each format is one module
here implementing `base.RecordFormat`, found by name in the registry below (`get`), so a new
format is a new module and a line in `_HOMES`, never a branch in the task code. A file's
format travels with it as its name (descriptions, states) or its code (`code`: a small int
per record in a task's `ChunkRefs`).

Modules load on first use: naming a format loads nothing but this module.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import RecordFormat

ARRAYRECORD = "arrayrecord"

# name -> the module that implements it (its `FORMAT`); a format's code is its place here.
_HOMES: dict[str, str] = {
    ARRAYRECORD: ".arrayrecord",
    "tfrecord": ".tfrecord",
}
NAMES: tuple[str, ...] = tuple(_HOMES)
_LOADED: dict[str, RecordFormat] = {}


def guess(path: str) -> str:
    """The format a file's name suggests: TFRecord for `*.tfrecord(s)` and TFDS's
    `*.tfrecord-00000-of-00008`, ArrayRecord otherwise (for tools; pipelines say it)."""
    # (a read instruction, `[start:end]`, is cut off; a glob's `[0-9]` is part of the name)
    name = re.sub(r"\[-?\d*:-?\d*\]$", "", path.rsplit("/", 1)[-1].lower())
    if any(name.endswith(s) or f"{s}-" in name for s in (".tfrecord", ".tfrecords")):
        return "tfrecord"
    return ARRAYRECORD


def check(name: str) -> str:
    """`name` if it names a format; ValueError naming the formats otherwise."""
    if name not in _HOMES:
        raise ValueError(f"unknown record format {name!r}: one of {', '.join(NAMES)}")
    return name


def get(name: str) -> RecordFormat:
    """The format called `name` (ValueError if none is)."""
    fmt = _LOADED.get(name)
    if fmt is None:
        module = importlib.import_module(_HOMES[check(name)], __name__)
        fmt = _LOADED[name] = module.FORMAT
    return fmt


def code(name: str) -> int:
    """The small int that stands for format `name` in a task's per-record arrays."""
    return NAMES.index(check(name))


def by_code(c: int) -> RecordFormat:
    """The format whose `code` is `c`."""
    return get(NAMES[c])
