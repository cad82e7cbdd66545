"""Row groups decoded from only their fetched ranges give what `pyarrow.parquet.read_table`
gives: every row group size, compression, encoding and type the writers produce, and any
column selection; and the rows as elements follow the rules of aioloader/formats/parquet/rows.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aioloader.formats.parquet import rows, take_rows
from tests.support.parquet_files import open_file, read_all, read_elements, write

N = 1000


def _table(n: int = N) -> pa.Table:
    rng = np.random.default_rng(0)
    ints = rng.integers(-5, 50, n)
    return pa.table({
        "i": pa.array(ints, pa.int64()),
        "f": pa.array(rng.random(n).astype(np.float32)),
        "b": pa.array(ints % 3 == 0),
        "nulls": pa.array([None if k % 4 == 0 else int(k) for k in ints], pa.int32()),
        "s": pa.array([None if k % 7 == 0 else f"row {j} " * (j % 5) for j, k in
                       enumerate(ints)]),
        "bin": pa.array([bytes([j % 256]) * (j % 9) for j in range(n)], pa.binary()),
        "li": pa.array([None if j % 11 == 0 else list(range(j % 4)) for j in range(n)],
                       pa.list_(pa.int32())),
        "st": pa.array([{"x": j, "y": None if j % 3 else f"s{j}", "z": [1.5] * (j % 2)}
                        for j in range(n)]),
        "lll": pa.array([[[float(j)] * 2] * (j % 3) if j % 5 else [[1.0], [2.0, 3.0]]
                         for j in range(n)], pa.list_(pa.list_(pa.float64()))),
    })


def _oracle(data: bytes, columns=None) -> pa.Table:
    return pq.read_table(pa.BufferReader(data), columns=columns)


@pytest.mark.parametrize("row_group_size", [1, 7, 1000])
@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip"])
@pytest.mark.parametrize("use_dictionary", [True, False])
def test_every_row_group_matches_read_table(row_group_size, compression, use_dictionary):
    n = 60 if row_group_size == 1 else N  # a thousand one-row groups costs a second
    data = write(_table(n), row_group_size=row_group_size, compression=compression,
                 use_dictionary=use_dictionary)
    got = read_all(data)
    assert got.equals(_oracle(data))
    assert open_file(data)[2].num_row_groups == -(-n // row_group_size)


@pytest.mark.parametrize("columns", [["s"], ["st", "i"], ["lll", "nulls", "bin"], []])
def test_a_column_selection_reads_only_its_columns(columns):
    data = write(_table(), row_group_size=300, compression="snappy")
    got, want = read_all(data, columns), _oracle(data, columns)
    assert got.equals(want) and got.num_rows == want.num_rows
    assert read_elements(data, columns)[-1].keys() == set(columns)
    meta, layout, index = open_file(data, columns)
    assert layout.columns == tuple(columns)
    fetched = sum(index.fetch_bytes(g) for g in range(index.num_row_groups))
    wanted = sum(meta.row_group(g).column(leaf).total_compressed_size
                 for g in range(meta.num_row_groups) for leaf in layout.leaves)
    assert fetched == wanted  # the selected chunks' bytes, nothing between them


def test_a_selection_names_a_missing_column():
    data = write(_table(10))
    with pytest.raises(ValueError, match="no top-level column named 'nope'"):
        read_all(data, ["nope"])


def test_page_v2_and_statistics_off():
    data = write(_table(), row_group_size=400, data_page_version="2.0",
                 write_statistics=False, data_page_size=1024, compression="zstd")
    assert read_all(data).equals(_oracle(data))


def test_an_empty_file_and_an_empty_row_group():
    empty = _table().slice(0, 0)
    data = write(empty)
    assert read_all(data).equals(_oracle(data))
    assert read_elements(data) == []


def test_rows_follow_the_element_rules():
    data = write(_table(40), row_group_size=40)
    got = read_elements(data)
    want = _oracle(data).to_pylist()
    assert len(got) == len(want) == 40
    for g, w in zip(got, want):
        assert isinstance(g["i"], np.int64) and g["i"] == w["i"]
        assert isinstance(g["f"], np.float32) and isinstance(g["b"], np.bool_)
        assert g["nulls"] is None if w["nulls"] is None else isinstance(g["nulls"], np.int32)
        assert g["s"] == w["s"] and (g["s"] is None or isinstance(g["s"], str))
        assert isinstance(g["bin"], bytes) and g["bin"] == w["bin"]
        if w["li"] is None:
            assert g["li"] is None
        else:
            assert g["li"].dtype == np.int32 and g["li"].tolist() == w["li"]
            assert not g["li"].flags.writeable  # a view of the decoded column
        assert g["st"]["x"] == w["st"]["x"] and g["st"]["y"] == w["st"]["y"]
        assert g["st"]["z"].tolist() == w["st"]["z"]
        lll = g["lll"]
        lengths = {len(x) for x in w["lll"]}
        if len(lengths) == 1:  # rectangular: one 2-D array
            assert isinstance(lll, np.ndarray) and lll.tolist() == w["lll"]
            assert lll.shape == (len(w["lll"]), *lengths) if w["lll"] else lll.shape == (0,)
        else:  # ragged: a list of 1-D arrays
            assert isinstance(lll, list) and [x.tolist() for x in lll] == w["lll"]


def test_rows_and_take_rows_select():
    table = _oracle(write(_table(30)))
    assert [r["i"] for r in rows(table, 5, 9)] == table.column("i").to_pylist()[5:9]
    picked = take_rows(table, [29, 0, 3, 3])
    assert [r["s"] for r in picked] == [table.column("s")[k].as_py() for k in (29, 0, 3, 3)]
    with pytest.raises(IndexError):
        rows(table, 5, 31)
    with pytest.raises(IndexError):
        take_rows(table, [30])


def test_lists_of_strings_structs_and_null_items_are_lists():
    table = pa.table({
        "ls": pa.array([["a", None], []], pa.list_(pa.string())),
        "lst": pa.array([[{"k": 1}], None]),
        "lnull": pa.array([[1, None, 3], [4]], pa.list_(pa.int64())),
        "m": pa.array([[("a", 1)], []], pa.map_(pa.string(), pa.int32())),
    })
    got = read_elements(write(table))
    assert got[0]["ls"] == ["a", None] and got[1]["ls"] == []
    assert got[0]["lst"] == [{"k": 1}] and got[1]["lst"] is None
    assert got[0]["lnull"] == [1, None, 3]
    assert isinstance(got[1]["lnull"], list)  # its column holds nulls, its items are scalars
    assert got[0]["m"] == [("a", 1)]


def test_duckdb_files():
    duckdb = pytest.importorskip("duckdb")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "duck.parquet"
        for codec in ("uncompressed", "snappy", "zstd", "gzip"):
            duckdb.sql(f"""COPY (SELECT i, i * 0.5 AS f, 'name ' || i AS s,
                    CASE WHEN i % 3 = 0 THEN NULL ELSE i END AS maybe,
                    [i, i + 1] AS li, {{'a': i, 'b': [i::DOUBLE]}} AS st
                    FROM range(5000) t(i))
                TO '{out}' (FORMAT parquet, ROW_GROUP_SIZE 2048, COMPRESSION {codec})""")
            data = out.read_bytes()
            index = open_file(data)[2]
            assert index.num_row_groups == 3 and list(index.row_starts) == [0, 2048, 4096, 5000]
            assert read_all(data).equals(_oracle(data))
            assert read_all(data, ["st", "s"]).equals(_oracle(data, ["st", "s"]))


def test_pandas_files():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": range(50), "s": [f"x{i}" for i in range(50)]},
                         index=[f"r{i}" for i in range(50)])
    import io

    buf = io.BytesIO()
    frame.to_parquet(buf, row_group_size=20)
    data = buf.getvalue()
    assert read_all(data).equals(_oracle(data))


def test_rows_of_a_slice_and_a_take_are_those_rows():
    """Sliced and taken arrays keep their offsets: structs, lists and nulls of rows i..j and
    of a list of indices are those rows' values."""
    from tests.formats.test_parquet_property import _plain

    table = _oracle(write(_table(50)))
    want = table.to_pylist()
    for start, stop in ((0, 50), (3, 4), (17, 41), (50, 50)):
        got = [{k: _plain(v) for k, v in r.items()} for r in rows(table, start, stop)]
        assert got == want[start:stop]
    picked = [44, 2, 2, 13, 0]
    got = [{k: _plain(v) for k, v in r.items()} for r in take_rows(table, picked)]
    assert got == [want[i] for i in picked]


def test_other_arrow_types_round_trip():
    """Types the Arrow schema in the footer restores (fixed-size lists, large strings,
    timestamps, decimals, dictionaries) decode as read_table gives them."""
    import datetime
    import decimal

    table = pa.table({
        # (no null: pyarrow itself cannot read a null fixed-size list back)
        "fsl": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32(), 2)),
        "ls": pa.array(["a", None, "ccc"], pa.large_string()),
        "ts": pa.array([datetime.datetime(2024, 1, 1), None, datetime.datetime(2025, 1, 1)],
                       pa.timestamp("ms")),
        "dec": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-3.50")],
                        pa.decimal128(6, 2)),
        "dict": pa.array(["x", "y", "x"]).dictionary_encode(),
    })
    data = write(table, row_group_size=2)
    assert read_all(data).equals(_oracle(data))
    got = read_elements(data)
    assert got[0]["fsl"].tolist() == [1.0, 2.0] and got[2]["fsl"].tolist() == [5.0, 6.0]
    assert [r["ls"] for r in got] == ["a", None, "ccc"]
    assert got[1]["ts"] is None and got[2]["ts"] == datetime.datetime(2025, 1, 1)
    assert got[2]["dec"] == decimal.Decimal("-3.50")
    assert [r["dict"] for r in got] == ["x", "y", "x"]
