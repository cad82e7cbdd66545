"""A Parquet row as a record's bytes, and back: what the formats seam's decode returns for
Parquet (its records are bytes; a Parquet element is a dict).

A row is the dict the Parquet layer's `rows` / `take_rows` give (`parquet.rows`),
pickled (protocol 5). Pickle keeps every value's type as it is (NumPy scalars and their
dtypes, n-D arrays and their shapes, `str`, `bytes`, None, nested dicts and lists,
datetimes, decimals), so `row_from_bytes` gives back exactly what `rows` gave: one
conversion, in one place, and no value changed on the way. Two things differ: a list
column's arrays come back writable copies where `rows` gives read-only views, and the cost
is a pickling per row in the worker and an unpickling per element after it (a NumPy scalar
takes about a hundred bytes pickled).

The stash (`workers.formatstash`) keeps rows its own way (`rows_for_stash`): rows of numbers,
strings and binaries marshalled, with their number columns' NumPy types, which is several
times cheaper both ways than pickling NumPy scalars; any other row pickled as above.
"""

from __future__ import annotations

import marshal
import pickle
from collections.abc import Iterable
from typing import Any

__all__ = ["row_from_bytes", "row_from_stash", "rows_as_bytes", "rows_for_stash"]


def rows_as_bytes(table: Any, within: Iterable[int]) -> list[bytes]:
    """The rows at `within` (any order, repeats allowed) of a decoded row group (a
    `pyarrow.Table`), each as a record's bytes."""
    from .parquet.rows import take_rows

    return [pickle.dumps(row, protocol=5) for row in take_rows(table, list(within))]


def row_from_bytes(data: bytes | memoryview) -> dict[str, Any]:
    """The row `rows_as_bytes` made `data` from."""
    row = pickle.loads(data)
    if type(row) is not dict:
        raise ValueError(f"a Parquet record decodes to {type(row).__name__}, not a row")
    return row


# A row as the stash keeps it: a tag byte, then either (`_PLAIN`) the marshalled pair (the row
# with its numbers as Python numbers, the NumPy type of each number column) or (`_PICKLED`)
# the pickled row. Unpickling a NumPy scalar costs several times unmarshalling a row of a
# string and a number, and the stash's rows are made once and read once each.
_PLAIN, _PICKLED = ord("M"), ord("P")
_TYPES: dict[str, Any] = {}  # a dtype's name -> its NumPy scalar type


def rows_for_stash(table: Any, within: Iterable[int]) -> list[bytes]:
    """The rows at `within` of a decoded row group as the stash keeps them: a row of
    numbers (integers, float32/64, bools), strings and binaries, nulls among them, is
    marshalled with its number columns' NumPy types; any other row is pickled."""
    import numpy as np
    import pyarrow as pa

    idx = np.asarray(list(within), dtype=np.int64)
    names = table.column_names
    kinds: list[tuple[str, str]] = []
    for name, column in zip(names, table.columns):
        t = column.type
        if _numeric(t) and not pa.types.is_float16(t):
            kinds.append((name, np.dtype(t.to_pandas_dtype()).str))
        elif not (pa.types.is_string(t) or pa.types.is_large_string(t)
                  or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            return [bytes([_PICKLED]) + b for b in rows_as_bytes(table, idx.tolist())]
    if not names or len(set(names)) != len(names):  # (none, or a name twice: pickled as is)
        return [bytes([_PICKLED]) + b for b in rows_as_bytes(table, idx.tolist())]
    taken = table.take(pa.array(idx))
    columns = [c.to_pylist() for c in taken.columns]
    types = tuple(kinds)
    head = bytes([_PLAIN])
    dumps = marshal.dumps
    return [head + dumps((dict(zip(names, values)), types)) for values in zip(*columns)]


def row_from_stash(data: bytes | memoryview) -> dict[str, Any]:
    """The row `rows_for_stash` made `data` of: its numbers as the NumPy scalars `rows`
    gives (nulls stay None)."""
    view = memoryview(data)
    if not len(view) or view[0] not in (_PLAIN, _PICKLED):
        raise ValueError("a stashed Parquet row has no known tag")
    if view[0] == _PICKLED:
        return row_from_bytes(view[1:])
    row, types = marshal.loads(view[1:])
    for name, dtype in types:
        value = row[name]
        if value is not None:
            t = _TYPES.get(dtype)
            if t is None:
                import numpy as np

                t = _TYPES[dtype] = np.dtype(dtype).type
            row[name] = t(value)
    return row


def _numeric(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
