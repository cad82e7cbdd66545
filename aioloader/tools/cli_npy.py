"""`aioloader cat --format npy`: the records asked for as one .npy array, a row per record, in
the layout `aioloader convert` reads (`convert.read_records`: a row's bytes are a record), so
`cat --format npy` of a converted .npy gives the array back and `convert` of what cat wrote
gives the same records:

- typed records (the files record an element spec of one array, `dtype[shape]`): an array of
  that dtype, shape `(records, *shape)`; a variable first dimension must be the same size in
  every record asked for;
- untyped records (or `bytes` ones): `uint8`, shape `(records, length)`, when every record
  has the same length.

What one array cannot hold is refused before anything is written: records of different
lengths (a .npy has no ragged rows, and padding would lose the lengths) and records of named
fields (several arrays). The array is built in memory, as `np.load` will hold it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..elements.typed import BYTES, files_spec
from ..source import ArrayRecordSource
from ..urls import redact

__all__ = ["write_npy"]


def write_npy(src: ArrayRecordSource, records: Iterable[tuple[int, bytes]]) -> bytes:
    """The .npy file of `records` (`(index, record)` pairs of `src`)."""
    spec = files_spec([(redact(url), index.element_spec)
                       for url, index in zip(src.urls, src.file_indices)])
    if spec is not None and not spec.single:
        raise SystemExit(f"aioloader cat: --format npy: the records hold named fields ({spec}),"
                         " which one array cannot; use --format raw, hex or json")
    field = spec.fields[0] if spec is not None else None
    if field is None or field.dtype == BYTES:
        arr = _byte_rows(records)
    else:
        arr = _typed_rows(records, spec, field)
    out = io.BytesIO()
    np.lib.format.write_array(out, arr, allow_pickle=False)
    return out.getvalue()


def _byte_rows(records: Iterable[tuple[int, bytes]]) -> np.ndarray:
    rows: list[bytes] = []
    first: tuple[int, int] | None = None
    for i, record in records:
        if first is None:
            first = (i, len(record))
        elif len(record) != first[1]:
            _ragged(f"record {first[0]:,} is {first[1]:,} bytes, record {i:,} is "
                    f"{len(record):,}")
        rows.append(record)
    if first is None:
        return np.zeros((0, 0), np.uint8)
    return np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), first[1])


def _typed_rows(records: Iterable[tuple[int, bytes]], spec: Any, field: Any) -> np.ndarray:
    rows: list[np.ndarray] = []
    first: tuple[int, tuple[int, ...]] | None = None
    for i, record in records:
        row = spec.decode(record)
        if first is None:
            first = (i, row.shape)
        elif row.shape != first[1]:
            _ragged(f"record {first[0]:,} has shape {list(first[1])}, record {i:,} "
                    f"{list(row.shape)} ({spec})")
        rows.append(row)
    if not rows:
        shape = tuple(0 if d == -1 else d for d in field.shape)
        return np.zeros((0, *shape), np.dtype(field.dtype))
    return np.stack(rows)


def _ragged(which: str) -> None:
    raise SystemExit(f"aioloader cat: --format npy: records of different lengths ({which}): "
                     "a .npy array has rows of one length; nothing was written (choose "
                     "records of one length with --range or --index, or use --format raw, "
                     "hex or json)")
