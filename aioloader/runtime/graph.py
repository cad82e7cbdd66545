"""`Dataset.graph()`: the pipeline drawn stage by stage with the element after each (like
Grain's visualization mode), so a user sees types, shapes and dtypes before training.

Each stage's element is the first element of the pipeline cut after that stage, read by a
loader in this process (workers=0): what the loader would yield, not a guess.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..describe.dataset import Dataset


def spec(x: Any, depth: int = 0) -> str:
    """A short type description: `int32[256, 16]`, `bytes[1024]`, `{'id': int64, ...}`."""
    if depth > 4:
        return "..."
    if isinstance(x, np.ndarray):
        return f"{x.dtype}[{', '.join(map(str, x.shape))}]"
    if isinstance(x, np.generic):
        return str(x.dtype)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return f"bytes[{len(x)}]"
    if isinstance(x, str):
        return f"str[{len(x)}]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {spec(v, depth + 1)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(spec(v, depth + 1) for v in x[:4]) + (", ..." if len(x) > 4 else "")
        return f"{type(x).__name__}[{len(x)}]({inner})"
    return type(x).__name__


def _prefixes(ds: Dataset) -> list[Dataset | None]:
    """The pipeline cut after each stage of `ds.describe()`; None for index ops (they move
    positions, not elements)."""
    cut = replace(ds, index_ops=(), record_ops=(), batching=None, pack_batch=None,
                  batch_ops=())
    out: list[Dataset | None] = [cut, *([None] * len(ds.index_ops))]
    cut = replace(cut, index_ops=ds.index_ops)
    for op in ds.record_ops:
        out.append(cut := replace(cut, record_ops=(*cut.record_ops, op)))
    if ds.batching is not None:
        out.append(cut := replace(cut, batching=ds.batching))
    if ds.pack_batch is not None:
        out.append(cut := replace(cut, pack_batch=ds.pack_batch))
    for op in ds.batch_ops:
        out.append(cut := replace(cut, batch_ops=(*cut.batch_ops, op)))
    return out


def draw(ds: Dataset) -> str:
    """The pipeline, one stage a line, each with the spec of its first element."""
    lines = []
    for k, (stage, cut) in enumerate(zip(ds.describe(), _prefixes(ds), strict=True)):
        if cut is None:
            what = "(chooses positions; elements unchanged)"
        else:
            it = cut.loader(workers=0)
            try:
                what = spec(next(iter(it)))
            except StopIteration:
                what = "(no elements)"
            finally:
                it.close()
        lines.append(f"{'  ' * min(k, 1)}{'└─ ' if k else ''}{stage}: {what}")
    return "\n".join(lines)
