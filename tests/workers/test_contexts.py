"""Files of a contextual format (Parquet) in the workers: a task carries no context; a
decoding process that lacks a file's answers which (`Result.missing`), learns it once from
the task sent again, and decodes later tasks of that file without it (`workers.contexts`)."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import aioloader as al
from aioloader.workers.decode import Decoder
from aioloader.workers.messages import Pipeline, Task
from aioloader.workers.worker import run_task


def test_a_context_goes_to_a_process_once(tmp_path):
    for k in range(2):
        pq.write_table(pa.table({"id": np.arange(k * 40, k * 40 + 40)}),
                       tmp_path / f"p{k}.parquet", row_group_size=10)
    pipeline = Pipeline(record_ops=(), batch=None, batch_ops=())
    decoder = Decoder()
    with al.ParquetSource(str(tmp_path / "p*.parquet")) as src:
        table = src.table

        def task(k, ids):
            ids = np.asarray(ids, dtype=np.int64)
            return Task(k, ids, np.zeros_like(ids), refs=table.chunk_refs(ids),
                        table=table.token)

        first = task(0, [3, 45, 12])
        assert first.contexts is None and len(pickle.dumps(first)) < 2048
        got = run_task(first, pipeline, decoder)
        assert sorted(got.missing) == [0, 1] and got.count == 0
        first.contexts = table.contexts(got.missing)
        got = run_task(first, pipeline, decoder)
        assert got.missing is None and got.count == 3
        later = run_task(task(1, [79, 0, 41]), pipeline, decoder)
        assert later.missing is None and later.count == 3
        other = Task(2, first.indices, first.epochs, refs=first.refs, table="another table")
        assert sorted(run_task(other, pipeline, decoder).missing) == [0, 1]
    decoder.close()


def test_kept_states_are_bounded_by_bytes_least_recently_used_out(tmp_path):
    """A process keeps decoding states within a byte bound (their contexts' sizes times
    `STATE_PER_CONTEXT_BYTE`), not only a count: a file of a large footer pushes the least
    recently used out, never a state of the task at hand."""
    from aioloader.workers.contexts import STATE_PER_CONTEXT_BYTE, FileStates

    for k in range(3):
        pq.write_table(pa.table({f"c{j}": np.arange(k * 40, k * 40 + 40) for j in range(8)}),
                       tmp_path / f"p{k}.parquet", row_group_size=4)
    with al.ParquetSource(str(tmp_path / "p*.parquet")) as src:
        table = src.table
        one = len(table.indices[0].context) * STATE_PER_CONTEXT_BYTE
        states = FileStates(max_bytes=2 * one + one // 2)  # two fit, not three
        for k in range(3):
            refs = table.chunk_refs(np.asarray([k * 40], dtype=np.int64))
            states.learn(refs, table.token, table.contexts([k]), max_decoded=1 << 30)
            assert states.lacking(refs, table.token) == []
        assert len(states) == 2 and states.bytes <= 2 * one + one // 2
        first = table.chunk_refs(np.asarray([0], dtype=np.int64))
        assert states.lacking(first, table.token) == [0]  # the oldest went
        tiny = FileStates(max_bytes=1)  # the task's own states stay whatever the bound
        both = table.chunk_refs(np.asarray([0, 40], dtype=np.int64))
        tiny.learn(both, table.token, table.contexts([0, 1]), max_decoded=1 << 30)
        assert tiny.lacking(both, table.token) == []
