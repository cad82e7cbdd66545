"""How a run of output positions meets a source's multi-record chunks, worked out from
their `ChunkRefs` alone: whether it reads as an exact shuffle (most tasks want most of the
chunks they meet) and whether one process's cache of decoded chunks would decode a chunk
again. The runtime's horizons (`runtime.horizons`) ask these to choose between each task
decoding its own chunks and one shared decode a chunk per horizon (the stash)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .planning import ChunkRefs

SHARED = 0.5  # of the tasks, the share that want each chunk: a stash shared by workers


def everywhere(head: ChunkRefs, task: int, chunks: int) -> bool:
    """Whether `head` reads as an exact shuffle: most of its tasks (of `task` records) want
    most of the chunks they meet, and it meets most of the source's `chunks` multi-record
    chunks (a block shuffle's windows, or a sequential read, meet a few at a time)."""
    if head.count is None or not chunks:
        return False
    many = head.count > 1
    met = np.unique(head.chunk_keys()[many]).size
    return met >= SHARED * chunks and tasks_per_chunk(head, task) >= SHARED


def tasks_per_chunk(head: ChunkRefs, task: int) -> float:
    """Of the tasks of `task` consecutive records of `head` (a short `head` cut into at
    least 8), the share that want each multi-record chunk, on average over the chunks: near
    1 under an exact shuffle, near 1 / the tasks under a sequential read."""
    if head.count is None or not len(head):
        return 0.0
    many = head.count > 1
    if not many.any():
        return 0.0
    task = max(1, min(task, len(head) // 8))
    key = head.chunk_keys()[many]
    which = (np.arange(len(head), dtype=np.int64) // task)[many]
    tasks = (len(head) + task - 1) // task
    pairs = len(np.unique(np.stack([key, which], axis=1), axis=0))  # (chunk, task) pairs
    return pairs / np.unique(key).size / tasks


def thrashes(head: ChunkRefs, share: int, mean: float, task: int) -> bool:
    """Whether one decoding process's cache of `share` bytes (least recently used out; records
    costing it `mean` bytes each), serving tasks of `task` consecutive records of `head` in
    turn, would decode a multi-record chunk again: chunks that every task wants together
    (an exact shuffle) and do not fit, not chunks wanted one after the other (a block
    shuffle's windows, a sequential read). A short `head` is cut into at least 8 tasks."""
    if head.count is None or not len(head):
        return False
    key = head.chunk_keys()
    held: OrderedDict[int, float] = OrderedDict()
    size, seen = 0.0, set()
    task = max(1, min(task, len(head) // 8))
    for lo in range(0, len(head), task):
        count = head.count[lo : lo + task]
        keys, first = np.unique(key[lo : lo + task][count > 1], return_index=True)
        order = np.argsort(first)  # in the order the task first wants them
        for k, n in zip(keys[order].tolist(), count[count > 1][first[order]].tolist()):
            if k in held:
                held.move_to_end(k)
                continue
            if k in seen:
                return True
            seen.add(k)
            held[k] = n * mean
            size += n * mean
            while size > share:
                size -= held.popitem(last=False)[1]
    return False
