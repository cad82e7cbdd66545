"""A decoded row group's rows as elements: one dict per row, column name -> value.

Columns are converted whole, then zipped into rows, so the cost per row is a dict, not a
pyarrow scalar per value. A value is what pyarrow gives, in the shape NumPy users expect:

- a null is None;
- a number or bool is a NumPy scalar of the column's type (`np.int64(3)`, `np.float32`);
- a string is `str`, a binary `bytes`;
- a struct is a dict of its fields, by the same rules;
- a list of numbers or bools (no null items) is a 1-D NumPy array: a read-only view of the
  decoded column, no copy;
- a list of such lists is an n-D array when it is rectangular (every inner list the same
  length, no nulls at any level). A ragged one stays a Python list of the inner arrays:
  never padded, never an object array, so nothing pretends a shape the data has not. An
  empty list is an empty 1-D array;
- a list of anything else (strings, structs, or with null items) is a Python list;
- every other type (timestamps, decimals, maps, ...) is what `pyarrow.Scalar.as_py` gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["column_values", "rows", "take_rows", "values_cost"]

# What `column_values`' values take in Python (a bound, per value, besides its data): a list
# slot, and a NumPy scalar, a NumPy view, a str or bytes object, a dict, or a list
_SLOT, _SCALAR, _VIEW, _OBJECT, _DICT, _LIST = 8, 32, 128, 64, 232, 56


def rows(table: Any, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
    """Rows [start, stop) of a pyarrow Table (a decoded row group) as elements."""
    stop = table.num_rows if stop is None else stop
    if not 0 <= start <= stop <= table.num_rows:
        raise IndexError(f"rows [{start}, {stop}) of a row group of {table.num_rows}")
    return _elements(table.slice(start, stop - start))


def take_rows(table: Any, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
    """The rows at `indices` (any order, repeats allowed) of a pyarrow Table, as elements."""
    import pyarrow as pa

    idx = np.asarray(indices, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= table.num_rows):
        raise IndexError(f"a row outside [0, {table.num_rows}) of a row group")
    return _elements(table.take(pa.array(idx)))


def _elements(table: Any) -> list[dict[str, Any]]:
    names = table.column_names
    columns = [column_values(c) for c in table.columns]
    return [dict(zip(names, values)) for values in zip(*columns)] if names \
        else [{} for _ in range(table.num_rows)]


def column_values(column: Any) -> list[Any]:
    """One value per row of a pyarrow Array or ChunkedArray, by the rules above."""
    if hasattr(column, "chunks"):
        out: list[Any] = []
        for chunk in column.chunks:
            out.extend(_values(chunk))
        return out
    return _values(column)


def values_cost(column: Any) -> int:
    """The bytes `column_values(column)` takes in Python (an estimate by type that errs
    high): each value's object and list slot, and the data strings and bytes copy."""
    if hasattr(column, "chunks"):
        return sum(_cost(chunk) for chunk in column.chunks)
    return _cost(column)


def _cost(arr: Any) -> int:
    import pyarrow as pa

    t, n = arr.type, len(arr)
    if pa.types.is_dictionary(t):
        return _cost(arr.dictionary_decode())
    if _numeric(t):
        return n * (_SLOT + _SCALAR)
    if pa.types.is_struct(t):
        return n * (_SLOT + _DICT) + sum(_cost(arr.field(i)) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        items = arr.flatten()
        if _numeric(items.type) and items.null_count == 0:
            return n * (_SLOT + _VIEW)
        return n * (_SLOT + _LIST) + _cost(items)
    return n * (_SLOT + _OBJECT) + arr.nbytes


def _numeric(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _values(arr: Any) -> list[Any]:
    import pyarrow as pa

    t = arr.type
    if pa.types.is_dictionary(t):
        return _values(arr.dictionary_decode())
    if _numeric(t):
        if arr.null_count == 0:
            return list(arr.to_numpy(zero_copy_only=False))
        filled = list(arr.fill_null(False if pa.types.is_boolean(t) else 0)
                      .to_numpy(zero_copy_only=False))
        return _nulled(arr, filled)
    if pa.types.is_struct(t):
        fields = [_values(arr.field(i)) for i in range(t.num_fields)]
        names = [t.field(i).name for i in range(t.num_fields)]
        return _nulled(arr, [dict(zip(names, vs)) for vs in zip(*fields)]
                       if names else [{} for _ in range(len(arr))])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _lists(arr)
    return arr.to_pylist()


def _nulled(arr: Any, values: list[Any]) -> list[Any]:
    if arr.null_count == 0:
        return values
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    return [v if ok else None for v, ok in zip(values, valid)]


def _lists(arr: Any) -> list[Any]:
    import pyarrow as pa

    n = len(arr)
    if pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        offsets = (arr.offset + np.arange(n + 1, dtype=np.int64)) * size
    else:
        offsets = arr.offsets.to_numpy(zero_copy_only=False)
    child = arr.values  # the whole child: `offsets` index into it
    lo, hi = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
    items = child.slice(lo, hi - lo)
    offsets = offsets - lo
    if _numeric(child.type) and items.null_count == 0:
        flat = items.to_numpy(zero_copy_only=False)
        out: list[Any] = [flat[offsets[i]:offsets[i + 1]] for i in range(n)]
    else:
        inner = _values(items)
        out = [_stacked(inner[offsets[i]:offsets[i + 1]]) for i in range(n)]
    return _nulled(arr, out)


def _stacked(items: list[Any]) -> Any:
    """A list of inner values: one array when they are arrays of one shape (rectangular),
    else the list itself."""
    if not items or not all(isinstance(v, np.ndarray) for v in items):
        return items
    shape = items[0].shape
    if any(v.shape != shape for v in items):
        return items
    return np.stack(items)
