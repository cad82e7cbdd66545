"""Column pieces: a window's elements stacked once, where they are made, so that batches are
cut from them by slicing and concatenating instead of collating element by element.

With a filter before `batch()`, batch boundaries cross the windows a worker sees, so a
worker cannot build the batches; it can stack its window (`collate`, into its shared-memory
slot), and the batch is then a slice of one window's columns or a concatenation of slices
of several. That equals `collate` over the batch's elements only when every element has the
same structure and leaf kinds (`schema`): the same dict keys in the same order, one dtype and
shape per array field, one Python type per number field (ints within int64), text fields all
str or bytes. `stack` returns None otherwise, and the window travels as elements. When two
windows' schemas differ (an int field in one, a float in the next, say), their columns are
turned back into the exact elements (`rebuild`) and `collate` decides, with its own dtype
promotion and its own errors.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# A schema is a nested tuple: ("dict", {key: schema}) in the elements' key order (compared
# without regard to order, as `collate` takes the order of a batch's first element);
# ("tuple", (schema, ...)); ("text",); ("py", int | float | bool); ("array", dtype, shape)
# for np.ndarray leaves; ("scalar", dtype) for NumPy scalars.
Schema = tuple

_INT64 = (-(1 << 63), (1 << 63) - 1)


def stack(elements: Sequence[Any], alloc: Alloc | None = None) -> tuple[Schema, Any] | None:
    """`(schema, columns)`: what `collate(elements, alloc=alloc)` gives, when every element
    shares one structure (None otherwise, or when a leaf is of a kind not cut into columns:
    lists, None, objects). Checks first, so nothing is allocated for a window that fails."""
    leaves: list[tuple[Schema, list]] = []
    sch = _schema(elements, leaves)
    if sch is None:
        return None
    stacked = iter([_stack(s, values, alloc) for s, values in leaves])
    return sch, _fill(sch, stacked)


Alloc = Callable[[tuple[int, ...], np.dtype], "np.ndarray | None"]
_dtype, _shape = operator.attrgetter("dtype"), operator.attrgetter("shape")


def _schema(values: Sequence[Any], leaves: list) -> Schema | None:
    """The values' common schema (their leaves' value lists appended to `leaves`, in
    order), or None. Checks run in C (`map`, `set`): this runs once per element and field."""
    first = values[0]
    kind = type(first)
    types = set(map(type, values))
    if kind is dict:
        keys = tuple(first)
        if types != {dict} or set(map(tuple, values)) != {keys}:
            return None  # another type, other keys, or the same keys in another order
        fields = {}
        for k in keys:
            sub = _schema([e[k] for e in values], leaves)
            if sub is None:
                return None
            fields[k] = sub
        return ("dict", fields)
    if kind is tuple:
        if types != {tuple} or set(map(len, values)) != {len(first)}:
            return None
        subs = []
        for i in range(len(first)):
            sub = _schema([e[i] for e in values], leaves)
            if sub is None:
                return None
            subs.append(sub)
        return ("tuple", tuple(subs))
    if types <= {str, bytes}:
        sch: Schema = ("text",)
    elif kind in (int, float, bool) and len(types) == 1:
        if kind is int and (min(values) < _INT64[0] or max(values) > _INT64[1]):
            return None
        sch = ("py", kind)
    elif len(types) == 1 and (kind is np.ndarray or issubclass(kind, np.generic)):
        dtypes = set(map(_dtype, values))
        if len(dtypes) != 1 or first.dtype.hasobject:
            return None
        if kind is np.ndarray:
            if len(set(map(_shape, values))) != 1:
                return None
            sch = ("array", first.dtype, first.shape)
        else:
            sch = ("scalar", first.dtype)
    else:
        return None
    leaves.append((sch, values))
    return sch


def _stack(sch: Schema, values: list, alloc: Alloc | None) -> Any:
    """One leaf's column, as `collate` stacks it."""
    if sch[0] == "text":
        return list(values)
    if sch[0] == "py":
        stacked = np.array(values)
        out = alloc(stacked.shape, stacked.dtype) if alloc is not None else None
        if out is None:
            return stacked
        out[...] = stacked
        return out
    shape = (len(values), *(sch[2] if sch[0] == "array" else ()))
    out = alloc(shape, sch[1]) if alloc is not None else None
    return np.stack(values) if out is None else np.stack(values, out=out)


def _fill(sch: Schema, stacked: Any) -> Any:
    """The columns in the schema's structure (leaves taken in `_schema`'s order)."""
    if sch[0] == "dict":
        return {k: _fill(s, stacked) for k, s in sch[1].items()}
    if sch[0] == "tuple":
        return tuple(_fill(s, stacked) for s in sch[1])
    return next(stacked)


def take(sch: Schema, cols: Any, lo: int, hi: int) -> Any:
    """Elements `[lo, hi)` of a window's columns, as `collate` would stack them."""
    tag = sch[0]
    if tag == "dict":
        return {k: take(sch[1][k], cols[k], lo, hi) for k in cols}
    if tag == "tuple":
        return tuple(take(s, c, lo, hi) for s, c in zip(sch[1], cols))
    return cols[lo:hi]


def concat(sch: Schema, parts: Sequence[Any]) -> Any:
    """Columns of consecutive runs of elements (same schema) joined into one batch."""
    tag = sch[0]
    if tag == "dict":
        return {k: concat(sch[1][k], [p[k] for p in parts]) for k in parts[0]}
    if tag == "tuple":
        return tuple(concat(s, [p[i] for p in parts]) for i, s in enumerate(sch[1]))
    if tag == "text":
        return [x for p in parts for x in p]
    return np.concatenate(parts)


def rebuild(sch: Schema, cols: Any, lo: int, hi: int) -> list[Any]:
    """Elements `[lo, hi)` as they were before stacking: same types, dtypes and values."""
    tag = sch[0]
    if tag == "dict":
        keys = list(cols)
        values = [rebuild(sch[1][k], cols[k], lo, hi) for k in keys]
        return [dict(zip(keys, row)) for row in zip(*values)] if keys else \
            [{} for _ in range(hi - lo)]
    if tag == "tuple":
        values = [rebuild(s, c, lo, hi) for s, c in zip(sch[1], cols)]
        return list(zip(*values)) if values else [() for _ in range(hi - lo)]
    if tag == "text":
        return list(cols[lo:hi])
    if tag == "py":
        return cols[lo:hi].tolist()
    if tag == "array":
        return [cols[i, ...] for i in range(lo, hi)]
    return [cols[i] for i in range(lo, hi)]  # NumPy scalars
