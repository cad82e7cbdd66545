"""A Parquet row as a record's bytes (`formats.parquetrows`): each row of a decoded row
group, turned into bytes and back, equals what the Parquet layer's `rows` gives, value for
value and type for type (NumPy dtypes and shapes included)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aioloader.formats.parquet import rows
from aioloader.formats.parquetrows import (
    row_from_bytes,
    row_from_stash,
    rows_as_bytes,
    rows_for_stash,
)


def _same(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b or (a != a and b != b)


def _table() -> pa.Table:
    n = 40
    return pa.table({
        "i8": pa.array(np.arange(n, dtype=np.int8)),
        "u64": pa.array([None if j % 5 == 0 else j for j in range(n)], pa.uint64()),
        "f32": pa.array(np.linspace(0, 1, n, dtype=np.float32)),
        "nan": pa.array([float("nan")] * n),
        "flag": pa.array([j % 2 == 0 if j % 7 else None for j in range(n)]),
        "s": [None if j % 3 == 0 else f"s{j}é" for j in range(n)],
        "b": [bytes([j]) * j for j in range(n)],
        "vec": pa.array([list(range(j % 4)) for j in range(n)], pa.list_(pa.float32())),
        "grid": [[[j, j], [j, j]] for j in range(n)],
        "ragged": [[[j]] * (j % 2) + [[j, j]] for j in range(n)],
        "strs": [["a", None] if j % 2 else [] for j in range(n)],
        "st": [{"x": j, "y": None if j % 2 else "t"} for j in range(n)],
        "ts": pa.array(np.arange(n).astype("datetime64[ms]")),
    })


@pytest.mark.parametrize("row_group_size", [1, 9, 40])
def test_rows_round_trip_exactly(tmp_path, row_group_size):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, row_group_size=row_group_size)
    f = pq.ParquetFile(path)
    for g in range(f.num_row_groups):
        table = f.read_row_group(g)
        want = rows(table)
        got = [row_from_bytes(b) for b in rows_as_bytes(table, range(table.num_rows))]
        _same(got, want)


def test_rows_at_any_places_in_any_order(tmp_path):
    table = _table()
    picks = [5, 0, 39, 5]
    got = [row_from_bytes(b) for b in rows_as_bytes(table, picks)]
    _same(got, [rows(table, j, j + 1)[0] for j in picks])


def test_a_row_is_its_own_bytes_object():
    out = rows_as_bytes(_table(), [1, 2])
    assert all(type(b) is bytes for b in out) and out[0] != out[1]


PLAIN = ["i8", "u64", "f32", "nan", "flag", "s", "b"]  # numbers, strings, binaries, nulls


NUMBERS = ["i8", "f32", "nan"]  # numbers, no nulls: packed as NumPy records


@pytest.mark.parametrize("columns", [NUMBERS, PLAIN, None],
                         ids=["packed", "marshalled", "pickled"])
def test_rows_as_the_stash_keeps_them_round_trip_exactly(columns):
    """A row of numbers without nulls goes into the stash packed, of numbers, strings and
    binaries marshalled, any other pickled: either way it comes back as `rows` gives it,
    NumPy scalar types included."""
    table = _table() if columns is None else _table().select(columns)
    picks = [5, 0, 39, 5, 21]
    head, stashed = rows_for_stash(table, picks)
    assert head[:1] == (b"P" if columns is None else b"M" if columns is PLAIN else b"N")
    got = [row_from_stash(memoryview(b), memoryview(head)) for b in stashed]
    _same(got, [rows(table, j, j + 1)[0] for j in picks])


def test_a_stashed_row_is_its_values_not_its_schema():
    """The column names and types are kept once an entry (its head), so a row of narrow
    numbers takes its decoded bytes, and a marshalled row no more than a few bytes a value
    over them."""
    ids = np.arange(1000, dtype=np.int64)
    narrow = pa.table({"id": ids, **{f"column_{j}": pa.array((ids + j) % 100, pa.int8())
                                     for j in range(10)}})
    head, stashed = rows_for_stash(narrow, range(1000))
    sizes = {len(b) for b in stashed}
    assert sizes == {narrow.nbytes // narrow.num_rows} == {18}
    assert b"column_3" in head
    _same([row_from_stash(b, head) for b in rows_for_stash(narrow, [7, 3])[1]],
          [rows(narrow, j, j + 1)[0] for j in [7, 3]])
    odd = pa.table({"": pa.array([1, 2]), "flag": pa.array([True, False]),
                    "u": pa.array([2**64 - 1, 0], pa.uint64())})
    head, stashed = rows_for_stash(odd, [1, 0])
    _same([row_from_stash(b, head) for b in stashed], [rows(odd, j, j + 1)[0] for j in [1, 0]])
    head, stashed = rows_for_stash(odd.select(["flag", "u"]), [1, 0])
    assert head[:1] == b"N"
    _same([row_from_stash(b, head) for b in stashed],
          [rows(odd.select(["flag", "u"]), j, j + 1)[0] for j in [1, 0]])
    with_null = narrow.set_column(1, "column_0", pa.array([None] + [1] * 999, pa.int8()))
    head, stashed = rows_for_stash(with_null, range(1000))
    assert head[:1] == b"M" and max(len(b) for b in stashed) <= 18 + 6 * 11


def test_a_stashed_row_without_a_known_tag_is_refused():
    with pytest.raises(ValueError, match="tag"):
        row_from_stash(b"junk", b"Xjunk")


def test_a_packed_row_of_the_wrong_size_is_refused():
    head, stashed = rows_for_stash(_table().select(NUMBERS), [0])
    with pytest.raises(ValueError, match="bytes"):
        row_from_stash(next(iter(stashed))[:-1], head)


def test_a_row_group_with_a_name_twice_is_pickled_as_rows_gives_it():
    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array(["12", "b"])], names=["x", "x"])
    head, stashed = rows_for_stash(table, [0, 1])
    assert head == b"P"
    _same([row_from_stash(b, head) for b in stashed], rows(table))


def test_rows_go_into_the_stash_without_pandas_installed():
    """pandas is not a dependency: a row of numbers is packed by pyarrow and NumPy alone."""
    import subprocess
    import sys

    code = """
import importlib.abc, sys
class NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is not installed")
sys.meta_path.insert(0, NoPandas())
import pyarrow as pa
from aioloader.formats.parquetrows import row_from_stash, rows_for_stash
t = pa.table({"a": pa.array([1, 2, 3], pa.int8()), "b": pa.array([1.5, 2, 3], pa.float32())})
head, rows = rows_for_stash(t, [2, 0])
print(len(list(rows)))
"""
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["2"]


NUMERIC = [pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(),
           pa.uint16(), pa.uint32(), pa.uint64(), pa.float32(), pa.float64()]


@pytest.mark.parametrize("t", NUMERIC, ids=str)
def test_a_number_column_is_packed_at_the_type_pyarrow_converts_it_to(t):
    from aioloader.formats.parquetrows import _numpy_type

    values = pa.array([True, False, True] if t == pa.bool_() else [1, 0, 1], type=t)
    assert _numpy_type(t) == values.to_numpy(zero_copy_only=False).dtype.str
    table = pa.table({"x": values, "y": pa.array([3, 4, 5], pa.int64())})
    head, stashed = rows_for_stash(table, [2, 0, 1])
    _same([row_from_stash(b, head) for b in stashed], [rows(table)[k] for k in (2, 0, 1)])


def test_packing_rows_does_not_import_pandas(tmp_path):
    """Where pandas is installed, converting an Arrow array to NumPy may import it (a third of
    a second, in each worker's first fill): the stash's rows are made without it."""
    import subprocess
    import sys

    code = """
import sys
import pyarrow.parquet as pq
from aioloader.formats.parquetrows import rows_for_stash
for columns in (["a", "b"], ["a", "b", "c"]):  # (packed; marshalled)
    t = pq.ParquetFile(sys.argv[1]).read_row_group(0, columns=columns)
    for wanted in ([2, 0], list(range(100))):  # (a few rows taken; the whole group)
        head, rows = rows_for_stash(t, wanted)
        assert len(list(rows)) == len(wanted)
print("pandas" in sys.modules)
"""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": pa.array([k % 100 for k in range(100)], pa.int8()),
                             "b": pa.array([k / 2 for k in range(100)], pa.float32()),
                             "c": pa.array([None if k % 7 else str(k) for k in range(100)])}),
                   path)
    got = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["False"]


def test_packed_rows_of_sliced_and_chunked_columns_are_their_own():
    """Columns of several chunks, each a slice at an offset (bools among them: bits)."""
    t = pa.table({"b": pa.array([k % 3 == 0 for k in range(20)]),
                  "i": pa.array(range(20), pa.int16()),
                  "f": pa.array([k / 4 for k in range(20)], pa.float64())})
    table = pa.concat_tables([t.slice(3, 5), t.slice(11, 7), t.slice(0, 1)])
    assert table.column("b").num_chunks == 3
    want = [12, 0, 5, 12, 3]
    head, stashed = rows_for_stash(table, want)
    assert head[:1] == b"N"
    _same([row_from_stash(b, head) for b in stashed], [rows(table)[k] for k in want])


@pytest.mark.parametrize("columns", [["i", "f"], ["i", "f", "s"]], ids=["packed", "plain"])
def test_a_few_rows_of_a_large_row_group_are_taken_and_give_the_same_rows(columns):
    """Rows wanted are taken out of the row group when they are few of its rows (a horizon
    of many), else read off the whole group: the same rows either way, in the order asked,
    repeats and chunked columns included; a row not in the group is an error."""
    t = pa.table({"i": pa.array(range(300), pa.int32()),
                  "f": pa.array([k / 3 for k in range(300)]),
                  "s": pa.array([f"row {k}" if k % 5 else None for k in range(300)])})
    table = pa.concat_tables([t.slice(0, 120), t.slice(120, 180)]).select(columns)
    whole = rows(table)
    for want in ([297, 3, 150, 3], list(range(299, -1, -1))):  # (sparse; dense)
        head, stashed = rows_for_stash(table, want)
        _same([row_from_stash(b, head) for b in stashed], [whole[k] for k in want])
    for bad in ([300], [-1]):
        with pytest.raises(IndexError):
            rows_for_stash(table, bad)


def test_an_empty_chunk_of_a_number_column_is_skipped():
    empty = pa.chunked_array([pa.array([], pa.int64()), pa.array([4, 5], pa.int64())])
    table = pa.table({"x": empty})
    head, stashed = rows_for_stash(table, [1, 0])
    assert [int(row_from_stash(b, head)["x"]) for b in stashed] == [5, 4]
