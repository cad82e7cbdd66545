"""How a Ray call's tasks travel (`raycalls.call_args`, `pieces`): pickled in pieces small
enough for Ray to send inside the call, the tasks whole again once joined."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from aioloader.index.planning import ChunkRefs
from aioloader.workers import raycalls
from aioloader.workers.messages import Task


@given(st.binary(max_size=2000), st.integers(1, 300))
def test_pieces_are_in_order_and_none_is_over_the_size(blob, size):
    got = raycalls.pieces(blob, size)
    assert b"".join(got) == blob
    assert all(len(p) <= size for p in got) and all(got[:-1])
    assert len(got) == max(1, -(-len(blob) // size))


def _task(task_id: int, n: int, raws: list | None = None) -> Task:
    z = np.zeros(n, np.int64)
    refs = ChunkRefs(["/data/a.array_record"], z, z, z, z + 100, z)
    return Task(task_id, np.arange(n, dtype=np.int64), z, refs, raws=raws)


def test_a_calls_tasks_go_in_pieces_that_join_to_them():
    tasks = [_task(0, 5000), _task(1, 3)]
    whole, parts = raycalls.call_args(tasks)
    assert whole is None and len(parts) > 1
    assert all(len(p) <= raycalls.INLINE_BYTES for p in parts)
    back = pickle.loads(b"".join(parts))
    assert [t.task_id for t in back] == [0, 1]
    assert all((a.indices == b.indices).all() for a, b in zip(back, tasks))


def test_tasks_with_chunk_bytes_go_as_they_are():
    tasks = [_task(0, 3, raws=[b"x" * 10] * 3)]
    assert raycalls.call_args(tasks) == (tasks, [])
