"""A Parquet chunk's records (`formats.parquetchunks`): a file opened through the seam's
index step, each chunk's range cut from the file's bytes and decoded, gives every row as
the Parquet layer's `rows` gives it from pyarrow's own read of the row group."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aioloader.formats.parquet import ParquetFormatError, rows
from aioloader.formats.parquet.footer import footer_range
from aioloader.formats.parquetchunks import ParquetChunks
from aioloader.formats.parquetrows import row_from_bytes
from tests.formats.test_parquet_index import _drive
from tests.formats.test_parquet_rowbytes import _same

BUDGET = 64 << 20


def _table(n: int) -> pa.Table:
    return pa.table({"a": pa.array(np.arange(n)),
                     "b": [None if j % 3 == 0 else f"b{j}" for j in range(n)],
                     "v": [None if j % 4 == 0 else [j, j + 1] for j in range(n)],
                     "c": pa.array(np.arange(n) * 0.5)})


def _open(path, columns=None):
    data = path.read_bytes()
    index, _ = _drive(path, columns=columns)
    off, length = footer_range(str(path), len(data), data[-8:], max_bytes=BUDGET)
    chunks = ParquetChunks(str(path), len(data), data[off:off + length], columns,
                           max_decoded=BUDGET)
    return data, index, chunks


@pytest.mark.parametrize("rows_per_group", [1, 13, 200])
@pytest.mark.parametrize("columns", [None, ["c", "b"], ["v"]])
def test_every_row_as_pyarrow_reads_it(tmp_path, rows_per_group, columns):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(200), path, row_group_size=rows_per_group)
    data, index, chunks = _open(path, columns)
    f = pq.ParquetFile(path)
    ends = index.chunk_ends
    groups = np.flatnonzero(index.chunk_records > 0)  # (the rest: no selected bytes)
    assert len(groups) == f.metadata.num_row_groups
    for g, c in enumerate(groups.tolist()):
        start, end = int(index.chunk_offsets[c]), int(ends[c])
        n = int(index.chunk_records[c])
        got = [row_from_bytes(b) for b in chunks.records(
            data[start:end], start, range(n), max_decoded=BUDGET, expected_records=n)]
        _same(got, rows(f.read_row_group(g, columns=columns)))


def test_a_damaged_chunk_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(_table(100), path, row_group_size=50)
    data, index, chunks = _open(path)
    start, end = int(index.chunk_offsets[1]), int(index.chunk_ends[1])
    with pytest.raises(ParquetFormatError, match=r"bad\.parquet"):
        chunks.records(data[start:end - 10], start, [0], max_decoded=BUDGET)
    with pytest.raises(ParquetFormatError, match=r"bad\.parquet"):
        chunks.records(data[start:end], start + 1, [0], max_decoded=BUDGET)
    with pytest.raises(ParquetFormatError, match="index has 7"):
        chunks.records(data[start:end], start, [0], max_decoded=BUDGET, expected_records=7)


def test_kept_bytes_stay_the_sum_of_the_kept_costs_when_another_thread_evicted():
    """A row group grown (its values converted) after another thread evicted it comes back
    with its whole cost counted, which its eviction later takes off."""
    from aioloader.formats.parquetchunks import KeptRowGroups, _Kept

    kept = KeptRowGroups()
    one = _Kept(pa.table({"a": np.arange(100)}))
    kept.put((0, 0), one, 1 << 30)
    big = _Kept(pa.table({"b": np.arange(1000)}))
    kept.put((0, 1), big, one.cost + big.cost - 1)  # (another thread's: `one` goes)
    assert kept.get((0, 0)) is None
    kept.put((0, 0), one, 1 << 30, grown=500)  # (the values converted meanwhile)
    assert kept.bytes == sum(k.cost for k in kept._items.values())
    kept.put((0, 2), _Kept(pa.table({"c": np.arange(10)})), 0)  # everything else out
    assert len(kept._items) == 1
    assert kept.bytes == sum(k.cost for k in kept._items.values())


def test_a_kept_row_groups_cost_covers_its_values_of_nested_and_string_columns(tmp_path):
    """Rows taken of a row group of list, struct and string columns: what the kept row
    group is counted as covers its Table once and the Python values made of it."""
    import tracemalloc

    from aioloader.formats import parquetchunks as pc

    n = 5000
    table = pa.table({"tok": [list(range(i % 3)) for i in range(n)],
                      "words": [[f"w{i}"] * (i % 3) for i in range(n)],
                      "meta": [{"k": i, "s": "x"} for i in range(n)],
                      "s": [f"r{i}" for i in range(n)], "x": np.arange(n)})
    path = tmp_path / "m.parquet"
    pq.write_table(table, path, row_group_size=n)
    data, index, chunks = _open(path)
    start, end = int(index.chunk_offsets[0]), int(index.chunk_ends[0])
    pc.KEPT.clear()
    tracemalloc.start()
    try:
        chunks.rows(data[start:end], start, [0], max_decoded=BUDGET)
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    (kept,) = pc.KEPT._items.values()
    assert kept.cost >= kept.table.nbytes + traced, (kept.cost, kept.table.nbytes, traced)
    assert kept.cost <= 2 * (kept.table.nbytes + traced), (kept.cost, traced)  # (once)
    pc.KEPT.clear()
