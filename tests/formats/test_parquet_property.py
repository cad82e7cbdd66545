"""Property: for random tables, row-group sizes and writer settings, decoding every row
group from only its fetched ranges gives `read_table`'s rows, as a table and as elements."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.parquet_files import read_all, read_elements, write

_maybe_int = st.one_of(st.none(), st.integers(-2**40, 2**40))
COLUMNS = {
    "i": (pa.int64(), _maybe_int),
    "f": (pa.float32(), st.floats(width=32, allow_nan=False)),
    "s": (pa.string(), st.one_of(st.none(), st.text(max_size=8))),
    "b": (pa.binary(), st.binary(max_size=8)),
    "li": (pa.list_(pa.int16()), st.one_of(st.none(), st.lists(st.integers(-99, 99),
                                                                max_size=4))),
    "ll": (pa.list_(pa.list_(pa.float64())),
           st.lists(st.lists(st.floats(allow_nan=False), max_size=3), max_size=3)),
    "st": (pa.struct([("x", pa.int32()), ("y", pa.string())]),
           st.one_of(st.none(), st.fixed_dictionaries(
               {"x": st.integers(-5, 5), "y": st.one_of(st.none(), st.text(max_size=3))}))),
}


@st.composite
def tables(draw):
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=4,
                          unique=True))
    n = draw(st.integers(0, 25))
    return pa.table({name: pa.array([draw(COLUMNS[name][1]) for _ in range(n)],
                                    COLUMNS[name][0]) for name in names})


def _plain(value):
    """An element's value as `to_pylist` gives it (arrays -> lists, NumPy scalars -> Python)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@settings(max_examples=25, deadline=None)
@given(tables(), st.integers(1, 15), st.sampled_from(["none", "snappy", "zstd"]),
       st.booleans(), st.data())
def test_decoding_from_fetched_ranges_is_read_table(table, group_rows, codec, dictionary,
                                                    data):
    raw = write(table, row_group_size=group_rows, compression=codec,
                use_dictionary=dictionary)
    want = pq.read_table(pa.BufferReader(raw))
    assert read_all(raw).equals(want)
    columns = data.draw(st.lists(st.sampled_from(table.column_names), unique=True))
    got = [{k: _plain(v) for k, v in row.items()} for row in read_elements(raw, columns)]
    assert got == want.select(columns).to_pylist()
