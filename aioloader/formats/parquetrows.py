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

The stash (`workers.formatstash`) keeps rows its own way (`rows_for_stash`): what an entry's
rows share (column names, NumPy types) once in its head, then each row as its values alone:
packed as a NumPy record (numbers, no nulls: its decoded bytes), or marshalled (strings,
binaries, nulls), which is several times cheaper both ways than pickling NumPy scalars;
any other row pickled as above.
"""

from __future__ import annotations

import marshal
import pickle
from collections.abc import Iterable, Iterator
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


# An entry of the stash (a row group's wanted rows) keeps what its rows share once, in its
# head: a tag byte, then the marshalled (column names, each number column's NumPy type).
# Its rows are then, by the tag: (`_PACKED`) the row's values packed as a NumPy record of
# those types (numbers only, no nulls: a row takes its decoded bytes); (`_PLAIN`) the
# marshalled tuple of its values, numbers as Python numbers (strings, binaries, nulls);
# (`_PICKLED`) the pickled row. Unpickling a NumPy scalar costs several times unmarshalling
# a row of a string and a number, and the stash's rows are made once and read once each.
_PACKED, _PLAIN, _PICKLED = ord("N"), ord("M"), ord("P")
_TYPES: dict[str, Any] = {}  # a dtype's name -> its NumPy scalar type
_HEADS: dict[bytes, Any] = {}  # an entry's head -> what `row_from_stash` reads it as
_STEP = 1024  # rows taken out of the row group's Table at a time
_SPARSE = 4  # wanted rows under 1/4 of a row group's: taken, not the whole group converted


def rows_for_stash(table: Any, within: Iterable[int]) -> tuple[bytes, Iterator[bytes]]:
    """The rows at `within` of a decoded row group as the stash keeps them: the entry's
    head, and its rows, made one at a time (a consumer that stops early makes no more).
    A row of numbers (integers, float32/64, bools) and no nulls is packed as a NumPy
    record; of numbers, strings and binaries, nulls among them, marshalled; any other is
    pickled."""
    import numpy as np
    import pyarrow as pa

    idx = np.asarray(within if isinstance(within, np.ndarray) else list(within),
                     dtype=np.int64)
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= table.num_rows):
        raise IndexError(f"rows {int(idx.min())}..{int(idx.max())} wanted of a row group of "
                         f"{table.num_rows}")
    names = table.column_names
    kinds: list[tuple[str, str]] = []
    for name, column in zip(names, table.columns):
        t = column.type
        if _numeric(t) and not pa.types.is_float16(t):
            kinds.append((name, _numpy_type(t)))
        elif not (pa.types.is_string(t) or pa.types.is_large_string(t)
                  or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            return bytes([_PICKLED]), _pickled(table, idx)
    if not names or len(set(names)) != len(names):  # (none, or a name twice: pickled as is)
        return bytes([_PICKLED]), _pickled(table, idx)
    types = tuple(kinds)
    if len(types) == len(names) and all(names) and not any(c.null_count
                                                            for c in table.columns):
        # (NumPy names a record's field "" f0: such a row is marshalled)
        head = bytes([_PACKED]) + marshal.dumps((tuple(names), types))
        return head, _packed(table, idx, np.dtype([(n, d) for n, d in types]))
    head = bytes([_PLAIN]) + marshal.dumps((tuple(names), types))
    return head, _plain(table, idx)


def _pickled(table: Any, idx: Any) -> Iterator[bytes]:
    for lo in range(0, len(idx), _STEP):
        yield from rows_as_bytes(table, idx[lo : lo + _STEP].tolist())


def _packed(table: Any, idx: Any, dtype: Any) -> Iterator[bytes]:
    import numpy as np

    size = dtype.itemsize
    for part, at in _parts(table, idx):
        out = np.empty(part.num_rows, dtype=dtype)
        for name, column in zip(part.column_names, part.columns):
            out[name] = _numbers(column, dtype[name])
        for lo in range(0, len(at), _STEP):
            data = out[at[lo : lo + _STEP]].tobytes()
            for k in range(len(data) // size):
                yield data[k * size : (k + 1) * size]


def _plain(table: Any, idx: Any) -> Iterator[bytes]:
    dumps = marshal.dumps
    for part, at in _parts(table, idx):
        rows = list(zip(*(c.to_pylist() for c in part.columns)))
        for k in at.tolist():
            yield dumps(rows[k])


def _parts(table: Any, idx: Any) -> Iterator[tuple[Any, Any]]:
    """(a table, the places in it of the rows wanted, in order), for rows `idx` of `table`:
    the whole row group when they are many of its rows (one conversion of every column),
    else the wanted rows taken `_STEP` at a time (a horizon of many wants few)."""
    import numpy as np
    import pyarrow as pa

    if len(idx) * _SPARSE >= table.num_rows:
        yield table, idx
        return
    for lo in range(0, len(idx), _STEP):
        step = np.ascontiguousarray(idx[lo : lo + _STEP], dtype=np.int64)
        # (an index array made from its buffer: `pa.array` would import pandas)
        taken = table.take(pa.Array.from_buffers(pa.int64(), len(step),
                                                 [None, pa.py_buffer(step)]))
        yield taken, np.arange(len(step))


def _numbers(column: Any, dtype: Any) -> Any:
    """A numeric column without nulls as a NumPy array of `dtype`, read from its Arrow
    buffers: pyarrow's conversions (`to_numpy`, `take`, `pa.array`) import pandas where it
    is installed, a third of a second in each worker's first fill."""
    import numpy as np

    parts = []
    for chunk in column.chunks:
        n, at, data = len(chunk), chunk.offset, chunk.buffers()[1]
        if not n:  # (its data buffer may be None)
            continue
        if dtype == np.bool_:
            bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
            parts.append(bits[at : at + n].astype(np.bool_))
        else:
            parts.append(np.frombuffer(data, dtype, count=at + n)[at:])
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def row_from_stash(data: bytes | memoryview, head: bytes | memoryview) -> dict[str, Any]:
    """The row `rows_for_stash` made `data` of, in an entry of head `head`: its numbers as
    the NumPy scalars `rows` gives (nulls stay None)."""
    key = bytes(head)
    read = _HEADS.get(key)
    if read is None:
        if len(_HEADS) >= 4096:  # (schemas seen by this process: a bound; safe in threads)
            _HEADS.clear()
        read = _HEADS[key] = _reader(key)
    return read(data)


def _reader(head: bytes) -> Any:
    """What reads a row of an entry of `head`."""
    if not head or head[0] not in (_PACKED, _PLAIN, _PICKLED):
        raise ValueError("a stashed Parquet row's entry has no known tag")
    if head[0] == _PICKLED:
        return row_from_bytes
    import numpy as np

    names, types = marshal.loads(head[1:])
    if head[0] == _PACKED:
        dtype = np.dtype([(n, d) for n, d in types])

        def packed(data: bytes | memoryview) -> dict[str, Any]:
            if len(data) != dtype.itemsize:
                raise ValueError(f"a stashed Parquet row of {len(data)} bytes, not "
                                 f"{dtype.itemsize}")
            rec = np.frombuffer(data, dtype=dtype, count=1)[0]
            return {n: rec[n] for n in names}

        return packed
    typed = []
    for name, dtype_name in types:
        t = _TYPES.get(dtype_name)
        if t is None:
            t = _TYPES[dtype_name] = np.dtype(dtype_name).type
        typed.append((names.index(name), t))

    def plain(data: bytes | memoryview) -> dict[str, Any]:
        values = list(marshal.loads(data))
        if len(values) != len(names):
            raise ValueError(f"a stashed Parquet row of {len(values)} values, not "
                             f"{len(names)}")
        for k, t in typed:
            if values[k] is not None:
                values[k] = t(values[k])
        return dict(zip(names, values))

    return plain


def _numeric(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _numpy_type(t: Any) -> str:
    """The NumPy type string of a numeric Arrow type (integers, float32/64, bools), as
    pyarrow converts its values: from the type's kind and width, with no conversion (one
    of an empty array imports pandas where it is installed, a third of a second in each
    worker, and `to_pandas_dtype` needs it)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return np.dtype(np.bool_).str
    kind = "f" if pa.types.is_floating(t) else "i" if pa.types.is_signed_integer(t) else "u"
    return np.dtype(f"{kind}{t.bit_width // 8}").str
