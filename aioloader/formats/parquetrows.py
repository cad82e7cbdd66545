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
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

__all__ = ["row_from_bytes", "rows_as_bytes"]


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
