"""Parquet files read by the loader (`Dataset.from_parquet`, `ParquetSource`), with
`pyarrow.parquet.read_table` as the oracle: files pyarrow writes with several row-group
sizes, compressions, dictionary encoding, nulls and nested types, and files pandas and
DuckDB write, give the rows read_table gives, in file order; and everything a pipeline does
over ArrayRecord files works over them (exact shuffle, resume bit for bit, elastic resume,
read instructions, a mix with ArrayRecord and TFRecord files, the index cache, graph())."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import aioloader as al
from aioloader.formats.tfrecord import frame
from tests.formats.test_parquet_hostile import CASES as HOSTILE
from tests.formats.test_parquet_hostile import _good
from tests.support.elastic import elastic_ids, resumed
from tests.support.parquet_files import damaged_row_group

N = 240  # rows in the glob's files together


def plain(value):
    """A value as read_table's `to_pylist` gives it (NumPy scalars and arrays as Python)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def oracle(paths, columns=None) -> list[dict]:
    return [row for p in paths for row in pq.read_table(p, columns=columns).to_pylist()]


def _table(lo: int, n: int) -> pa.Table:
    ids = np.arange(lo, lo + n)
    return pa.table({
        "id": pa.array(ids),
        "text": [None if i % 7 == 0 else f"row {i} " + "t" * (i % 23) for i in ids],
        "label": pa.array([f"c{i % 3}" for i in ids]).dictionary_encode(),
        "score": pa.array(ids * 0.25, type=pa.float32()),
        "tokens": [None if i % 11 == 0 else list(range(i % 5)) for i in ids],
        "grid": [[[i, i + 1], [i + 2, i + 3]] for i in ids],
        "meta": [{"k": int(i), "tag": None if i % 2 else "even"} for i in ids],
        "blob": [bytes([i % 256]) * (i % 4) for i in ids],
    })


# (row group size, compression, dictionary) of each of the glob's files
VARIANTS = [(7, "snappy", True), (50, "zstd", False), (1000, "gzip", True), (13, "none", True)]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("parquet")
    paths, per = [], N // len(VARIANTS)
    for k, (rows, codec, dictionary) in enumerate(VARIANTS):
        path = root / f"part-{k}.parquet"
        pq.write_table(_table(k * per, per), path, row_group_size=rows, compression=codec,
                       use_dictionary=dictionary)
        paths.append(str(path))
    with al.ArrayRecordWriter(root / "same.array_record", group_size=1) as w:
        for i in range(N):
            w.write(json.dumps({"id": i}).encode())
    (root / "same.tfrecord").write_bytes(
        b"".join(frame(json.dumps({"id": i}).encode()) for i in range(N)))
    return {"glob": str(root / "part-*.parquet"), "paths": paths, "root": root,
            "ar": str(root / "same.array_record"), "tf": str(root / "same.tfrecord")}


def _ids(ds: al.Dataset, **kw) -> list[int]:
    return [int(row["id"]) for row in ds.loader(**kw)]


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_are_the_ones_read_table_gives(files, workers):
    got = list(al.Dataset.from_parquet(files["glob"]).loader(workers=workers))
    assert [plain(r) for r in got] == oracle(files["paths"])
    row = got[5]  # the element's types: NumPy scalars and arrays, str, bytes, None
    assert isinstance(row["id"], np.int64) and isinstance(row["score"], np.float32)
    assert isinstance(row["tokens"], np.ndarray) and row["grid"].shape == (2, 2)
    assert isinstance(row["text"], str) and isinstance(row["blob"], bytes)


@pytest.mark.parametrize("columns", [["id"], ["grid", "text"], ["meta", "label", "id"]])
def test_only_the_selected_columns(files, columns):
    got = list(al.Dataset.from_parquet(files["glob"], columns=columns).loader(workers=0))
    assert [list(r) for r in got[:1]] == [columns]
    assert [plain(r) for r in got] == oracle(files["paths"], columns)
    with al.ParquetSource(files["glob"], columns=columns) as src:
        assert len(src) == N
        assert [plain(r) for r in src[[200, 3, 77]]] == \
            [oracle(files["paths"], columns)[i] for i in (200, 3, 77)]


def test_random_access(files):
    want = oracle(files["paths"])
    with al.ParquetSource(files["glob"]) as src:
        assert len(src) == N
        for i in (0, 59, 60, 61, 239, 128):
            assert plain(src[i]) == want[i]
        copy = pickle.loads(pickle.dumps(src))
        with copy:
            assert plain(copy[100]) == want[100]


def test_an_unknown_column_is_named(files):
    with pytest.raises(ValueError, match="nope"):
        list(al.Dataset.from_parquet(files["glob"], columns=["id", "nope"]).loader(workers=0))


def test_files_pandas_and_duckdb_write(tmp_path):
    pd = pytest.importorskip("pandas")
    frame_ = pd.DataFrame({"id": np.arange(90), "name": [f"n{i}" for i in range(90)],
                           "x": np.linspace(0, 1, 90)})
    frame_.to_parquet(tmp_path / "pandas.parquet", row_group_size=20)
    paths = [str(tmp_path / "pandas.parquet")]
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "duck.parquet"
    duckdb.sql("SELECT range AS id, 'd' || range::VARCHAR AS name, [range, range * 2] AS v "
               "FROM range(300)").write_parquet(str(out), row_group_size=64)
    paths.append(str(out))
    for p in paths:
        got = [plain(r) for r in al.Dataset.from_parquet(p).loader(workers=0)]
        assert got == oracle([p])
    assert [int(r["id"]) for r in al.Dataset.from_parquet(paths).loader(workers=0)] == \
        list(range(90)) + list(range(300))


def _digest(ds: al.Dataset, **kw) -> str:
    h = hashlib.sha256()
    for batch in ds.loader(**kw):
        for k in sorted(batch):
            h.update(k.encode())
            h.update(repr(plain(batch[k])).encode())
    return h.hexdigest()


def test_exact_shuffle_covers_each_row_once_per_epoch_whatever_the_workers(files):
    ds = al.Dataset.from_parquet(files["glob"], columns=["id"]).shuffle(seed=3).repeat(2)
    got = _ids(ds, workers=2)
    first, second = got[:N], got[N:]
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second  # re-keyed per epoch
    assert got == _ids(ds, workers=0)
    batched = al.Dataset.from_parquet(files["glob"], columns=["id", "score", "grid", "label"]
                                      ).shuffle(seed=3).batch(16)
    assert _digest(batched, workers=0) == _digest(batched, workers=2)


def test_block_shuffle_and_shards(files):
    ds = al.Dataset.from_parquet(files["glob"], columns=["id"])
    got = _ids(ds.shuffle(seed=5, strategy="block", block_bytes=512, window_bytes=4096),
               workers=0)
    assert sorted(got) == list(range(N)) and got != sorted(got)
    parts = [_ids(ds.shuffle(seed=1).shard(k, 3), workers=0) for k in range(3)]
    assert sorted(i for part in parts for i in part) == list(range(N))


def _ids_of(row):
    return row["id"]


def _pipeline_of(files) -> al.Dataset:
    return (al.Dataset.from_parquet(files["glob"], columns=["id", "tokens"]).shuffle(seed=9)
            .repeat(2).map(_ids_of).batch(8, drop_remainder=True))


@pytest.mark.parametrize("at", [0, 11, 37])
def test_resume_is_bit_for_bit(files, at):
    whole, rest, state = resumed(_pipeline_of(files), at)
    assert all(isinstance(v, (int, str, list, dict, type(None))) for v in state.values())
    assert rest == whole[at + 1:]


def test_elastic_resume_covers_every_row_once(files, monkeypatch):
    """2 processes (told so, as jax would) stop after 3 steps; 3 resume; every row comes
    once in the epoch across the change."""
    pytest.importorskip("jax")
    base = al.Dataset.from_parquet(files["glob"], columns=["id"]).shuffle(seed=4)
    got = elastic_ids(monkeypatch, lambda procs: base.shard_by_jax_process().map(_ids_of)
                      .batch(12 // procs, drop_remainder=True))
    assert len(got) == len(set(got)) == N // 12 * 12


def test_a_read_instruction_takes_rows_of_one_file(files):
    path = files["paths"][0]
    got = [plain(r) for r in al.Dataset.from_parquet(f"{path}[5:23]").loader(workers=0)]
    assert got == oracle([path])[5:23]


def _any_id(record):
    return int(record["id"]) if isinstance(record, dict) else json.loads(record)["id"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_and_a_concatenation_with_arrayrecord_and_tfrecord(files, workers):
    pq_ = al.Dataset.from_parquet(files["glob"], columns=["id"])
    ar = al.Dataset.from_arrayrecord(files["ar"])
    tf = al.Dataset.from_tfrecord(files["tf"])
    both = al.Dataset.concatenate([pq_, ar, tf]).map(_any_id)
    assert list(both.loader(workers=workers)) == list(range(N)) * 3
    mixed = al.Dataset.mix([pq_.shuffle(1), tf.shuffle(2)], [1, 1]).shuffle(seed=3)
    got = list(mixed.map(_any_id).loader(workers=workers))
    assert Counter(got) == Counter({i: 2 for i in range(N)})
    assert "parquet" in mixed.describe()[0]


def test_graph_and_stats_name_the_format(files):
    ds = al.Dataset.from_parquet(files["glob"], columns=["id"]).map(_ids_of).batch(4)
    assert ds.describe()[0].startswith("parquet(")
    assert "parquet(" in ds.graph()
    with ds.loader(workers=0) as it:
        next(iter(it))
        assert "parquet(" in str(it.stats())


def test_the_index_cache_is_kept_per_column_selection(files, tmp_path):
    cache = tmp_path / "idx"
    want = oracle(files["paths"], ["id", "text"])
    for columns in (["id", "text"], ["grid"]):
        with al.ParquetSource(files["glob"], columns=columns, index_cache_dir=cache) as src:
            assert not src.table.from_index_cache
    with al.ParquetSource(files["glob"], columns=["id", "text"], index_cache_dir=cache) as src:
        assert src.table.from_index_cache
        assert [plain(src[i]) for i in range(N)] == want
    with al.ParquetSource(files["glob"], columns=["grid"], index_cache_dir=cache) as src:
        assert src.table.from_index_cache
        assert list(src[0]) == ["grid"]
    ds = al.Dataset.from_parquet(files["glob"], columns=["id", "text"]).shuffle(seed=2)
    got = [plain(r) for r in ds.loader(workers=2, index_cache_dir=cache)]
    assert sorted(got, key=lambda r: r["id"]) == want


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_through_the_loader_is_an_error_naming_it(tmp_path, case):
    make, words = HOSTILE[case]
    path = tmp_path / "hostile.parquet"
    path.write_bytes(make(_good()))
    with pytest.raises(al.ParquetFormatError, match=r"hostile\.parquet") as got:
        list(al.Dataset.from_parquet(str(path)).shuffle(seed=1).loader(
            workers=0, memory_budget=64 << 20))
    assert words in str(got.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_data_page_names_the_file_and_row_group(tmp_path, workers):
    path = tmp_path / "bad.parquet"
    damaged_row_group(path, 5)
    with pytest.raises(al.ParquetFormatError, match=r"bad\.parquet, row group 1"):
        list(al.Dataset.from_parquet(str(path)).loader(workers=workers))


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_an_exact_shuffle_over_many_files_whichever_worker_runs_the_retry(tmp_path, executor):
    """A task sent again with contexts may go to another worker, which lacks other files of
    the task than the first one did: it must run there all the same."""
    for k in range(64):
        pq.write_table(pa.table({"id": np.arange(k * 10, (k + 1) * 10)}),
                       tmp_path / f"p{k:03d}.parquet", row_group_size=5)
    ds = al.Dataset.from_parquet(str(tmp_path / "p*.parquet")).shuffle(seed=0).repeat(2
                                                                                 ).batch(4)
    assert _digest(ds, workers=2, executor=executor) == _digest(ds, workers=0)


def test_describe_and_repr_show_the_selected_columns(files):
    ds = al.Dataset.from_parquet(files["glob"], columns=["id", "score"])
    assert "columns=['id', 'score']" in ds.describe()[0]
    assert "columns=['id', 'score']" in repr(ds)
    assert "columns" not in al.Dataset.from_parquet(files["glob"]).describe()[0]
    src = al.ParquetSource(files["glob"], columns=["id"])
    assert "columns=['id']" in repr(src)
    assert "columns" not in repr(al.ParquetSource(files["glob"]))


def test_a_cached_index_whose_row_counts_disagree_with_its_footer_is_a_miss(files, tmp_path):
    """An entry edited with its checksum made again (row counts larger than the row groups
    its cached footer describes) is not believed: the files are indexed afresh."""
    from aioloader.cache import index_cache
    from tests.cache.test_index_cache import _entries, _load_raw, _save_raw

    cache = tmp_path / "idx"
    with al.ParquetSource(files["paths"][0], columns=["id"], index_cache_dir=cache) as src:
        n = len(src)
    (name,) = _entries(cache)
    header, arrays = _load_raw(cache / name)
    assert len(arrays["counts"])
    arrays["counts"] = arrays["counts"] + 1000
    _save_raw(cache / name, header, arrays)
    header, arrays = _load_raw(cache / name)
    header["digest"] = index_cache._digest(header["key"], header["files"], arrays)
    _save_raw(cache / name, header, arrays)
    with al.ParquetSource(files["paths"][0], columns=["id"], index_cache_dir=cache) as src:
        assert not src.table.from_index_cache
        assert len(src) == n
