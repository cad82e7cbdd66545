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
