"""Which segments to fetch ahead, from the segments the next output positions fall in (pure).

The output order is a pure function of the plan, so the loader knows which records come
next. Fetching a whole segment (~4 MiB, one request) pays when many of the upcoming records
lie in it — a sequential read, a block shuffle, a dataset that fits — and wastes the network
when few do (an exact shuffle over a dataset much larger than memory: 4 MiB fetched for one
1 KiB record). The decision is counted, not guessed from the shuffle's name: walk the
upcoming positions until the distinct segments they touch fill `budget` bytes (what the
memory tier can hold for them); a segment is worth fetching when those positions need at
least `min_count` distinct chunks of it — the reads it saves: records of one chunk come in
one read anyway (a block shuffle over the chunks of a large-group file reads a chunk here and
there: not worth a segment; group size 1: a chunk is a record).
"""

from __future__ import annotations

import numpy as np


def dense_segments(segs, room, budget: int, min_count: int,
                   chunks=None) -> tuple[np.ndarray, int]:
    """`(wanted, cut)`: the segments that the first `cut` positions need at least
    `min_count` distinct chunks of (`chunks`: each position's global chunk; None: each
    position its own), in the order they are first needed; `cut` is the longest prefix of
    `segs` (the segment of each upcoming position, in order) whose distinct segments'
    `room` (bytes, indexed by segment) sums to at most `budget`."""
    segs = np.asarray(segs, dtype=np.int64)
    room = np.asarray(room, dtype=np.int64)
    if budget < 0 or min_count < 1:
        raise ValueError("budget must be >= 0 and min_count >= 1")
    if segs.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    uniq, first, inverse = np.unique(segs, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")  # distinct segments in first-use order
    fits = int(np.searchsorted(np.cumsum(room[uniq[by_first]]), budget, side="right"))
    cut = int(first[by_first[fits]]) if fits < len(uniq) else len(segs)
    inverse = inverse.ravel()[:cut]
    if chunks is not None:  # one count per distinct chunk: its first position
        _, once = np.unique(np.asarray(chunks, dtype=np.int64)[:cut], return_index=True)
        inverse = inverse[once]
    counts = np.bincount(inverse, minlength=len(uniq))
    chosen = by_first[:fits]
    return uniq[chosen[counts[chosen] >= min_count]], cut
