"""Record formats: how a file's chunk table is built and how a chunk's bytes become records.

Everything above this layer (opening, the record table, the planner, the workers) works on
one chunk table per file (`arrayrecord.FileIndex`: chunk offsets, records per chunk,
decoded sizes) and on chunks as byte ranges; what differs between formats is only how that
table is built from a file's bytes and how a chunk's bytes decode. Each format is one module
here implementing `base.RecordFormat`, found by name in the registry below (`get`), so a new
format is a new module and a line in `_HOMES`, never a branch in the task code. A file's
format travels with it as its name (descriptions, states) or its code (`code`: a small int
per record in a task's `ChunkRefs`).

A format that reads some of each record's columns (Parquet) is named with them: a *kind*,
`reading("parquet", ["a", "b"])` = `'parquet["a", "b"]'`, travels where a format's name does
(descriptions, the record table, the index cache's key), so what the columns change (the
chunk table, each file's context) is never mistaken for another selection's.

Modules load on first use: naming a format loads nothing but this module.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import RecordFormat

ARRAYRECORD = "arrayrecord"

# name -> the module that implements it (its `FORMAT`); a format's code is its place here.
_HOMES: dict[str, str] = {
    ARRAYRECORD: ".arrayrecord",
    "tfrecord": ".tfrecord",
    "parquet": ".parquetformat",
}
NAMES: tuple[str, ...] = tuple(_HOMES)
COLUMNAR = frozenset({"parquet"})  # formats whose records are rows of selectable columns
_LOADED: dict[str, RecordFormat] = {}


def guess(path: str) -> str:
    """The format a file's name suggests: TFRecord for `*.tfrecord(s)` and TFDS's
    `*.tfrecord-00000-of-00008`, Parquet for `*.parquet` / `*.parq` / `*.pq`, ArrayRecord
    otherwise (for tools; pipelines say it)."""
    # (a read instruction, `[start:end]`, is cut off; a glob's `[0-9]` is part of the name)
    name = re.sub(r"\[-?\d*:-?\d*\]$", "", path.rsplit("/", 1)[-1].lower())
    if any(name.endswith(s) or f"{s}-" in name for s in (".tfrecord", ".tfrecords")):
        return "tfrecord"
    if name.endswith((".parquet", ".parq", ".pq")):
        return "parquet"
    return ARRAYRECORD


def reading(name: str, columns: Sequence[str] | None = None) -> str:
    """The kind that reads format `name`'s records with only `columns` (None: all)."""
    check(name)
    if columns is None:
        return name
    if isinstance(columns, (str, bytes)) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"columns must be a list of column names, got {columns!r}")
    if name not in COLUMNAR:
        raise ValueError(f"{name} records have no columns to select (columns={columns!r})")
    if len(set(columns)) != len(columns):
        raise ValueError(f"columns names a column twice: {list(columns)!r}")
    return name + json.dumps(list(columns))


def split(kind: str) -> tuple[str, tuple[str, ...] | None]:
    """(format name, selected columns or None) of a kind (`reading`)."""
    at = kind.find("[")
    if at < 0:
        return kind, None
    try:
        columns = json.loads(kind[at:])
    except ValueError:
        columns = None
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"unknown record format {kind!r}: one of {', '.join(NAMES)}")
    return kind[:at], tuple(columns)


def base(kind: str) -> str:
    """The format's name in a kind (its columns cut off)."""
    return split(kind)[0]


def check(kind: str) -> str:
    """`kind` if it names a format (with columns only for a columnar one); ValueError
    naming the formats otherwise."""
    name, columns = split(kind)
    if name not in _HOMES:
        raise ValueError(f"unknown record format {kind!r}: one of {', '.join(NAMES)}")
    if columns is not None:
        reading(name, columns)
    return kind


def get(kind: str) -> RecordFormat:
    """The format a kind names, reading its columns (ValueError if none is)."""
    fmt = _LOADED.get(kind)
    if fmt is None:
        name, columns = split(check(kind))
        module = importlib.import_module(_HOMES[name], __name__)
        fmt = module.FORMAT if columns is None else module.FORMAT.selecting(columns)
        _LOADED[kind] = fmt
    return fmt


def code(kind: str) -> int:
    """The small int that stands for a kind's format in a task's per-record arrays."""
    return NAMES.index(split(check(kind))[0])


def by_code(c: int) -> RecordFormat:
    """The format whose `code` is `c`."""
    return get(NAMES[c])
