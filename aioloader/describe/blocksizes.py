"""A block shuffle's sizes, settled before the pipeline's fingerprint is taken.

`shuffle(seed, strategy="block")` without `block_bytes`/`window_bytes` is sized from the
loader's `resident_bytes` and `memory_budget` (`index.blocks.budget_sizes`), so that a window
fits the memory tier that reads a remote dataset in blocks. The sizes chosen are written into
the pipeline (its fingerprint, `stats()`'s graph, the saved state), and a resumed state keeps
the sizes it was saved with: a state from before this sizing (4 MiB / 64 MiB whatever the
budgets) resumes the stream it was saved in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from ..index.blocks import budget_sizes
from ..index.sampling import Shuffle
from .dataset import Dataset

_SAVED = re.compile(r"shuffle\(seed=(-?\d+), block, block_bytes=(\d+), window_bytes=(\d+)\)")


def unsized(dataset: Dataset) -> Shuffle | None:
    """The dataset's block shuffle if it leaves a size to the budgets, else None."""
    return next((op for op in dataset.index_ops if isinstance(op, Shuffle)
                 and op.strategy == "block" and not (op.block_bytes and op.window_bytes)), None)


def sized(dataset: Dataset, resident_bytes: int, memory_budget: int,
          saved: Sequence[str] = ()) -> Dataset:
    """`dataset` with its block shuffle's unset sizes chosen: those of the same shuffle in a
    saved state's pipeline `saved`, else from the budgets."""
    op = unsized(dataset)
    if op is None:
        return dataset
    block, window = budget_sizes(resident_bytes, memory_budget)
    for line in saved:
        m = _SAVED.fullmatch(line)
        if m and int(m[1]) == op.seed:
            block, window = int(m[2]), int(m[3])
    new = replace(op, block_bytes=op.block_bytes or block,
                  window_bytes=op.window_bytes or window)
    return replace(dataset, index_ops=tuple(new if o is op else o for o in dataset.index_ops))
