"""What a worker returns for a stream-mode task (a filter or pack before the batching): the
task's surviving elements in the form the parent assembles fastest, with the windows they
belong to.

- before `batch()`: stacked into columns (`aioloader.elements.columns`), arrays in the task's slot;
  the parent cuts batches from them;
- before `pack()`: each element's packed lengths and the pieces concatenated per feature
  (`pack_window`), arrays in the slot; the parent packs on lengths alone;
- otherwise, or when the elements do not allow it (mixed structures, say): the elements
  themselves, and the parent collates or packs them as it always did.

A task may cover several windows of output positions (fewer, larger tasks cost the parent
less); the result says where in the task each survivor was (`Result.survivors`), so that
the parent, which owns the windows, gives every element its resume tag `(window position,
index among the window's survivors)`, whatever the task size.
On the wire columns and packing pieces are tagged tuples (not classes) so that the arena's
tree walks (`arena.replace_leaves`) reach their arrays; elements are the plain list they
always were. `read` turns a payload into typed pieces, one per window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..elements.columns import Schema, stack, take
from ..elements.packing import check_pack_config
from ..elements.transforms import BatchOp, PackOp
from ..index.lanes import origin  # (re-exported: where windows of a region start)
from .arena import SlotAlloc

_COLUMNS, _PACKED = "aioloader.elements.columns", "aioloader.packed"
Windows = tuple[tuple[int, int], ...]  # (offset from the task's first position, survivors)


@dataclass(frozen=True)
class Columns:
    """A window's `count` elements stacked into columns of the given schema."""

    count: int
    schema: Schema
    cols: Any


@dataclass(frozen=True)
class Packed:
    """A window's `count` elements to pack: per feature (trailing shape, dtype), the
    truncated lengths (count, features) and the pieces concatenated per feature."""

    count: int
    signature: list[tuple[tuple[int, ...], np.dtype]]
    lengths: np.ndarray
    datas: list[np.ndarray]


Piece = Columns | Packed | list  # a list: the elements themselves


def windows_of(kept: Sequence[int], records: int, window: int, lo: int = 0,
               cuts: Sequence[int] = ()) -> Windows:
    """The windows of a task of `records` positions from output position `lo` (`window`
    each from the region's `origin`; 0: one window) and how many of the survivors (their
    positions in the task: `kept`) fall in each."""
    at = np.asarray(kept, dtype=np.int64)
    start = origin(lo, cuts) if cuts else lo
    if not window or (lo - start) % window == 0:
        window = window or records
        counts = np.bincount(at // window, minlength=-(-records // window)).tolist()
        return tuple((k * window, c) for k, c in enumerate(counts))
    first = window - (lo - start) % window  # the task starts inside a window (a state's)
    offsets = np.asarray([0, *range(first, records, window)], dtype=np.int64)
    counts = np.bincount(np.searchsorted(offsets, at, side="right") - 1,
                         minlength=len(offsets)).tolist()
    return tuple((int(o), c) for o, c in zip(offsets, counts))


def window_payload(elements: list, stream: BatchOp | PackOp | None,
                   alloc: SlotAlloc | None) -> tuple | list:
    """The wire form of a task's survivors for the parent's `stream` step."""
    if elements and stream is not None and not (isinstance(stream, BatchOp) and (
            stream.size == 1 or stream.rules is not None)):  # (padded: the parent collates)
        if isinstance(stream, PackOp):
            packed = pack_window(elements, stream.length_struct, alloc)
            if packed is not None:
                return (_PACKED, len(elements), *packed)
        else:
            stacked = stack(elements, alloc)
            if stacked is not None:
                return (_COLUMNS, len(elements), *stacked)
    return elements


def has_arrays(payload: tuple | list) -> bool:
    """Whether the payload's arrays go into the slot (elements are pickled as they are)."""
    return not isinstance(payload, list)


def read(lo: int, hi: int, payload: tuple | list, survivors: Sequence[int],
         window: int, cuts: Sequence[int] = ()) -> list[tuple[int, Piece]]:
    """The pieces a worker sent for the task over output positions `[lo, hi)`
    (`window_payload`; its arrays already lent from the slot; `survivors`: each survivor's
    place in the task): `(window position, piece)` for each window of `window` positions
    (0: the task is one window), windows also ending at `cuts` (`windows_of`)."""
    pos = lo
    windows = windows_of(survivors, hi - lo, window, lo, cuts)
    out: list[tuple[int, Piece]] = []
    lo = 0
    kind = None if isinstance(payload, list) else payload[0]
    if kind is None:
        elements = payload
        for offset, count in windows:
            out.append((pos + offset, elements[lo : lo + count] if len(windows) > 1  # type: ignore[arg-type]
                        else elements))
            lo += count
    elif kind == _COLUMNS:
        _, _, sch, cols = payload
        for offset, count in windows:
            part = cols if len(windows) == 1 else take(sch, cols, lo, lo + count)
            out.append((pos + offset, Columns(count, sch, part)))
            lo += count
    else:
        _, _, signature, lengths, datas = payload
        # where each element's piece starts in datas[f], and the end of the last
        starts = np.zeros((len(lengths) + 1, len(datas)), np.int64)
        np.cumsum(lengths, axis=0, out=starts[1:])
        for offset, count in windows:
            a, b = starts[lo], starts[lo + count]
            part = datas if len(windows) == 1 else [d[a[f] : b[f]] for f, d in enumerate(datas)]
            out.append((pos + offset, Packed(count, list(signature), lengths[lo : lo + count],
                                             list(part))))
            lo += count
    return out


def pack_window(
    elements: Sequence[Mapping[str, np.ndarray]],
    length_struct: Mapping[str, int],
    alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray | None] | None = None,
) -> tuple[list[tuple[tuple[int, ...], np.dtype]], np.ndarray, list[np.ndarray]] | None:
    """A run of elements to pack, as `(signature, lengths, datas)`: per feature its trailing
    shape and dtype, the truncated length of each element's piece (`lengths[i, f]`), and the
    pieces concatenated (`datas[f]`), so that packing needs no element objects
    (`FirstFit` decides on lengths, `assemble` lays out the data).

    None when packing these elements needs the elements themselves: one is not a plain dict
    of exactly the packed features, a feature is a scalar, or pieces of a feature differ in
    trailing shape or dtype (`pack_first_fit` then decides, and explains). `alloc(shape,
    dtype)` may supply the memory of the arrays (None: allocate).
    """
    names = list(length_struct)
    try:
        targets = check_pack_config(length_struct, 1).tolist()
    except (TypeError, ValueError):
        return None
    pieces: list[list[np.ndarray]] = [[] for _ in names]
    for element in elements:
        if type(element) is not dict or len(element) != len(names):
            return None
        for f, name in enumerate(names):
            if name not in element:
                return None
            array = np.asarray(element[name])
            if array.ndim == 0:
                return None
            pieces[f].append(array[: targets[f]])
    signature = []
    for column in pieces:
        trailing, dtype = column[0].shape[1:], column[0].dtype
        if dtype.hasobject or any(p.dtype != dtype or p.shape[1:] != trailing for p in column):
            return None
        signature.append((trailing, dtype))
    lengths = _array(alloc, (len(elements), len(names)), np.dtype(np.int64))
    for f, column in enumerate(pieces):
        lengths[:, f] = [len(p) for p in column]
    datas = []
    for f, column in enumerate(pieces):
        trailing, dtype = signature[f]
        out = _array(alloc, (int(lengths[:, f].sum()), *trailing), dtype)
        datas.append(np.concatenate(column, axis=0, out=out))
    return signature, lengths, datas


def _array(alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray | None] | None,
           shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    out = alloc(shape, dtype) if alloc is not None else None
    return np.empty(shape, dtype) if out is None else out
