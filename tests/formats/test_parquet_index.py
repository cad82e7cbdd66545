"""Parquet's chunk table for the formats seam (`formats.parquetindex`): a chunk per row
group, its rows and byte range checked against pyarrow's own reading of the file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aioloader.formats.parquet import ParquetFormatError
from aioloader.formats.parquetindex import open_index

BUDGET = 64 << 20


def _drive(path, *, columns=None, max_decoded=BUDGET):
    data = path.read_bytes()
    steps = open_index(len(data), path=str(path), max_decoded=max_decoded, columns=columns)
    reads = []
    try:
        offset, length = next(steps)
        while True:
            reads.append((offset, length))
            offset, length = steps.send(data[offset:offset + length])
    except StopIteration as stop:
        return stop.value, reads


def _table(n: int) -> pa.Table:
    return pa.table({"a": pa.array(np.arange(n)),
                     "b": [None if j % 3 == 0 else f"b{j}" for j in range(n)],
                     "c": pa.array(np.arange(n) * 0.5)})


@pytest.mark.parametrize("rows_per_group", [1, 7, 100, 1000])
def test_a_chunk_per_row_group_with_its_rows_and_bytes(tmp_path, rows_per_group):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(250), path, row_group_size=rows_per_group)
    index, _ = _drive(path)
    meta = pq.ParquetFile(path).metadata
    assert index.num_chunks == meta.num_row_groups
    assert index.chunk_records.tolist() == [meta.row_group(g).num_rows
                                            for g in range(meta.num_row_groups)]
    assert index.num_records == 250
    ends = index.chunk_ends
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        starts = [rg.column(i).dictionary_page_offset or rg.column(i).data_page_offset
                  for i in range(rg.num_columns)]
        stops = [s + rg.column(i).total_compressed_size for i, s in enumerate(starts)]
        assert index.chunk_offsets[g] == min(starts)
        assert max(stops) <= ends[g]  # every column's bytes lie in the chunk's range
    assert index.footer_offset <= len(path.read_bytes()) - 8


def test_selected_columns_start_the_range_at_the_first_selected(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(100), path, row_group_size=30)
    index, _ = _drive(path, columns=["c"])
    meta = pq.ParquetFile(path).metadata
    groups = np.flatnonzero(index.chunk_records > 0)  # (the rest: bytes no column selected)
    assert len(groups) == meta.num_row_groups
    for g, c in enumerate(groups.tolist()):
        col = meta.row_group(g).column(2)
        start = col.dictionary_page_offset or col.data_page_offset
        assert index.chunk_offsets[c] == start
        assert index.chunk_ends[c] == start + col.total_compressed_size  # and no further


def test_a_small_file_takes_one_read_a_long_footer_two(tmp_path):
    small = tmp_path / "s.parquet"
    pq.write_table(_table(10), small)
    assert len(_drive(small)[1]) == 1
    wide = tmp_path / "w.parquet"
    pq.write_table(pa.table({f"column_{i:04d}": [i] for i in range(3000)}), wide)
    index, reads = _drive(wide)
    assert len(reads) == 2 and index.num_records == 1


@pytest.mark.parametrize("damage", ["magic", "length", "short"])
def test_a_hostile_file_is_an_error_naming_it(tmp_path, damage):
    path = tmp_path / "bad.parquet"
    pq.write_table(_table(50), path, row_group_size=10)
    data = bytearray(path.read_bytes())
    if damage == "magic":
        data[-4:] = b"NOPE"
    elif damage == "length":
        data[-8:-4] = (len(data) * 4).to_bytes(4, "little")
    else:
        data = data[:5]
    path.write_bytes(bytes(data))
    with pytest.raises(ParquetFormatError, match=r"bad\.parquet"):
        _drive(path)


def test_a_footer_over_the_budget_is_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(50), path)
    with pytest.raises(ParquetFormatError, match="budget"):
        _drive(path, max_decoded=64)
