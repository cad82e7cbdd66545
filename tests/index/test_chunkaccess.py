"""Properties of `index.chunkaccess`: how a run of positions meets multi-record chunks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.index.chunkaccess import everywhere, tasks_per_chunk, thrashes
from aioloader.index.planning import ChunkRefs


def _refs(chunk_of: list[int], count: int = 100) -> ChunkRefs:
    start = np.asarray(chunk_of, dtype=np.int64) * 1000
    n = len(chunk_of)
    zeros = np.zeros(n, dtype=np.int64)
    return ChunkRefs(paths=["a"], file=zeros, chunk=start // 1000, start=start, end=start + 1,
                     within=zeros, count=np.full(n, count, np.int64))


runs = st.lists(st.integers(0, 30), min_size=1, max_size=400)


@settings(max_examples=60, deadline=None)
@given(runs, st.integers(1, 64))
def test_the_share_of_tasks_a_chunk_meets_is_a_share(chunk_of, task):
    share = tasks_per_chunk(_refs(chunk_of), task)
    assert 0.0 < share <= 1.0


@settings(max_examples=60, deadline=None)
@given(runs, st.integers(1, 64), st.floats(1.0, 4096.0))
def test_a_cache_that_holds_every_chunk_never_thrashes(chunk_of, task, mean):
    every = len(set(chunk_of)) * 100 * mean
    assert not thrashes(_refs(chunk_of), int(every) + 1, mean, task)


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 30), st.integers(8, 64), st.integers(1, 20))
def test_a_sequential_read_neither_thrashes_nor_reads_as_an_exact_shuffle(chunks, task, per):
    chunk_of = [c for c in range(chunks) for _ in range(task * per)]  # one chunk after another
    head = _refs(chunk_of, count=task * per)
    assert not thrashes(head, task * per * 10, 10.0, task)  # (room for one chunk)
    assert not everywhere(head, task, chunks)


def test_a_run_whose_every_task_wants_every_chunk_is_an_exact_shuffle():
    rng = np.random.default_rng(0)
    chunk_of = rng.permutation(np.repeat(np.arange(20), 64)).tolist()
    head = _refs(chunk_of)
    assert everywhere(head, 256, 20)
    assert thrashes(head, 5 * 100 * 10, 10.0, 256)  # (5 of 20 chunks fit)


def test_a_block_shuffles_window_thrashes_a_cache_it_does_not_fit_and_not_one_it_fits():
    """A block shuffle's window shuffles its records together: tasks of it want most of its
    chunks, as an exact shuffle's do, so a cache that holds fewer than the window's chunks
    decodes them again; one that holds the window does not, and a sequential read thrashes
    none, however small the cache."""
    rng = np.random.default_rng(1)
    chunks, per, window = 40, 100, 4
    keys = np.repeat(np.arange(chunks), per)
    windows = np.concatenate([rng.permutation(keys[a : a + window * per])
                              for a in range(0, len(keys), window * per)])

    def refs(k):
        k = np.asarray(k, dtype=np.int64)
        return ChunkRefs(paths=["a"], file=np.zeros(len(k), np.int64), chunk=k, start=k,
                         end=k + 1, within=np.zeros(len(k), np.int64),
                         count=np.full(len(k), per, np.int64))

    chunk_bytes = per * 10.0
    assert thrashes(refs(windows), 2 * chunk_bytes, 10.0, 32)
    assert not thrashes(refs(windows), (window + 1) * chunk_bytes, 10.0, 32)
    assert not thrashes(refs(keys), chunk_bytes, 10.0, 32)
