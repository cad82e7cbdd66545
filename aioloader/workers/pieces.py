"""What a worker returns for a stream-mode task (a filter or pack before the batching): its
window's surviving elements in the form the parent assembles fastest.

- before `batch()`: the window stacked into columns (`aioloader.columns`), arrays in the
  task's slot; the parent cuts batches from them;
- before `pack()`: each element's packed lengths and the pieces concatenated per feature
  (`packing.pack_window`), arrays in the slot; the parent packs on lengths alone;
- otherwise, or when the window's elements do not allow it (mixed structures, say): the
  elements themselves, as before, and the parent collates or packs them as it always did.

On the wire a piece is a tagged tuple (not a class) so that the arena's tree walks
(`arena.replace_leaves`) reach its arrays; `read` turns it back into a typed piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..columns import Schema, stack
from ..packing import pack_window
from ..transforms import BatchOp, PackOp
from .arena import SlotAlloc

_COLUMNS, _PACKED = "aioloader.columns", "aioloader.packed"


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


def window_payload(elements: list, stream: BatchOp | PackOp | None,
                   alloc: SlotAlloc | None) -> Any:
    """The wire form of a window's survivors for the parent's `stream` step."""
    if not elements or stream is None or (isinstance(stream, BatchOp) and stream.size == 1):
        return elements
    if isinstance(stream, PackOp):
        packed = pack_window(elements, stream.length_struct, alloc)
        return elements if packed is None else (_PACKED, len(elements), *packed)
    stacked = stack(elements, alloc)
    return elements if stacked is None else (_COLUMNS, len(elements), *stacked)


def read(payload: Any) -> Piece:
    """The piece a worker sent (`window_payload`), its arrays already lent from the slot."""
    if isinstance(payload, tuple) and payload and payload[0] == _COLUMNS:
        return Columns(*payload[1:])
    if isinstance(payload, tuple) and payload and payload[0] == _PACKED:
        _, count, signature, lengths, datas = payload
        return Packed(count, list(signature), lengths, list(datas))
    return payload
