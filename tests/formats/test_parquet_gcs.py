"""Parquet files in a bucket (the local GCS emulator, over real HTTP through gcsfs and our
client): the same rows as read_table gives locally; a named file opens in one request (its
footer comes with the tail read that finds its size); an index cache entry, per column
selection, spares every footer read; a row group is fetched as one range request, and an
epoch fetches no more than the files' bytes; damage names the gs:// object."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import aioloader as al
from aioloader.testing import ProxyStats, local_gcs
from tests.formats.test_parquet_loader import plain

FILES, ROWS, GROUP = 3, 200, 50


def _data(k: int) -> bytes:
    ids = np.arange(k * ROWS, (k + 1) * ROWS)
    table = pa.table({"id": ids, "text": [f"text {i} " * (i % 9) for i in ids],
                      "v": [[float(i), 0.5] for i in ids]})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=GROUP)
    return buf.getvalue()


DATA = [_data(k) for k in range(FILES)]


def _oracle(columns=None) -> list[dict]:
    return [r for d in DATA for r in pq.read_table(pa.BufferReader(d), columns=columns)
            .to_pylist()]


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True) as bucket:
        for k, data in enumerate(DATA):
            bucket.upload_bytes(data, f"pq/part-{k}.parquet")
        yield bucket


def _delta(before: ProxyStats, after: ProxyStats) -> dict[str, int]:
    return {f.name: getattr(after, f.name) - getattr(before, f.name)
            for f in dataclasses.fields(ProxyStats)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_glob_in_a_bucket_reads_the_rows_read_table_gives(gcs, workers):
    ds = al.Dataset.from_parquet(gcs.url("pq/part-*.parquet"), columns=["id", "v"],
                                 storage_options=gcs.storage_options)
    got = [plain(r) for r in ds.loader(workers=workers)]
    assert got == _oracle(["id", "v"])
    ids = [int(r["id"]) for r in ds.shuffle(seed=2).loader(workers=workers)]
    assert sorted(ids) == list(range(FILES * ROWS))


def test_a_named_file_opens_in_one_request_and_rows_come_by_row_group(gcs):
    before = gcs.proxy_stats
    with al.ParquetSource(gcs.url("pq/part-1.parquet"),
                          storage_options=gcs.storage_options) as src:
        assert len(src) == ROWS
        assert _delta(before, gcs.proxy_stats)["downloads"] == 1
        opened = gcs.proxy_stats
        assert plain(src[57]) == _oracle()[ROWS + 57]
        assert plain(src[58]) == _oracle()[ROWS + 58]  # the same row group: kept decoded
        took = _delta(opened, gcs.proxy_stats)
        assert took["downloads"] == 1 and took["bytes_down"] < len(DATA[1]) // 2


def test_an_epoch_fetches_no_more_than_the_files(gcs):
    ds = al.Dataset.from_parquet(gcs.url("pq/part-*.parquet"), columns=["id"],
                                 storage_options=gcs.storage_options).shuffle(seed=4)
    before = gcs.proxy_stats
    assert len(list(ds.loader(workers=0, resident_bytes=64 << 20))) == FILES * ROWS
    took = _delta(before, gcs.proxy_stats)
    assert took["bytes_down"] < sum(map(len, DATA)) * 1.5 + 64 * 1024


def test_the_index_cache_spares_the_footers_per_column_selection(gcs, tmp_path):
    url = gcs.url("pq/part-*.parquet")
    kw = dict(storage_options=gcs.storage_options, index_cache_dir=tmp_path / "idx")
    with al.ParquetSource(url, columns=["text"], **kw) as src:
        assert not src.table.from_index_cache
    before = gcs.proxy_stats
    with al.ParquetSource(url, columns=["text"], **kw) as src:
        assert len(src) == FILES * ROWS and src.table.from_index_cache
        assert _delta(before, gcs.proxy_stats)["downloads"] == 0  # a listing only
        assert plain(src[401]) == _oracle(["text"])[401]
    with al.ParquetSource(url, columns=["id"], **kw) as src:  # another selection: opened
        assert not src.table.from_index_cache and list(src[3]) == ["id"]


def test_a_damaged_object_names_its_url(gcs):
    data = DATA[0][: len(DATA[0]) // 2]
    url = gcs.upload_bytes(data, "pq/cut.parquet")
    with pytest.raises(al.ParquetFormatError, match=r"cut\.parquet"):
        list(al.Dataset.from_parquet(url, storage_options=gcs.storage_options)
             .loader(workers=0))


def test_only_the_selected_columns_bytes_are_fetched(gcs):
    rng = np.random.default_rng(0)
    table = pa.table({"id": np.arange(400),
                      "text": [rng.bytes(1000).hex() for _ in range(400)],  # ~800 KB
                      "score": rng.random(400)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=100)
    data = buf.getvalue()
    gcs.upload_bytes(data, "pq/wide.parquet")
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    for columns, leaves in ((["id"], [0]), (["score"], [2])):
        selected = sum(meta.row_group(g).column(c).total_compressed_size
                       for g in range(meta.num_row_groups) for c in leaves)
        ds = al.Dataset.from_parquet(gcs.url("pq/wide*.parquet"), columns=columns,
                                     storage_options=gcs.storage_options)
        before = gcs.proxy_stats
        got = [plain(r) for r in ds.shuffle(seed=1).loader(workers=0, resident_bytes=0)]
        took = _delta(before, gcs.proxy_stats)
        assert sorted(got, key=lambda r: r[columns[0]]) == \
            sorted(table.select(columns).to_pylist(), key=lambda r: r[columns[0]])
        # a glob: a listing, the tail read (64 KiB, the footer in it), then the selected
        # column chunks only (a name alone opens with one larger speculative read)
        assert took["bytes_down"] < selected + 64 * 1024 + 16 * 1024, columns
        assert took["bytes_down"] < len(data) // 5


@pytest.mark.parametrize("workers", [0, 2])
def test_the_disk_and_memory_tiers_serve_parquet(gcs, tmp_path, workers):
    ds = al.Dataset.from_parquet(gcs.url("pq/part-*.parquet"), columns=["id", "text"],
                                 storage_options=gcs.storage_options).shuffle(seed=1).repeat(2)
    want = sorted(range(FILES * ROWS))
    for kw in ({"cache_dir": tmp_path / f"disk{workers}", "resident_bytes": 0},
               {"resident_bytes": 64 << 20}):
        got = [int(r["id"]) for r in ds.loader(workers=workers, **kw)]
        assert sorted(got[:FILES * ROWS]) == sorted(got[FILES * ROWS:]) == want


@pytest.mark.parametrize("resident", [None, 0], ids=["kept", "no-memory-tier"])
@pytest.mark.parametrize("strategy", ["exact", "block"])
def test_rows_the_stash_holds_come_with_no_bytes_in_tasks_of_several_batches(
        gcs, strategy, resident, monkeypatch, tmp_path):
    """Under a shuffle through the stash (each row group pulled out once a horizon), a task
    whose rows the stash holds carries none of their bytes and groups batches as tasks over
    local files do: the bucket's epoch gives the local batches, and fetches each file's
    bytes once besides its opening read."""
    from aioloader.runtime import stashchoice

    monkeypatch.setattr(stashchoice, "LARGE_CHUNK", 1)  # (these row groups are small)
    local = []
    for k, data in enumerate(DATA):
        local.append(tmp_path / f"part-{k}.parquet")
        local[-1].write_bytes(data)
    sizes = {"block_bytes": 4000, "window_bytes": 16000} if strategy == "block" else {}

    def ds(paths, **kw):
        return (al.Dataset.from_parquet(paths, columns=["id", "text"], **kw)
                .shuffle(seed=3, strategy=strategy, **sizes).batch(8))

    with ds([str(p) for p in local]).loader(workers=2) as it:
        want = [plain(b) for b in it]
    before = gcs.proxy_stats
    with ds(gcs.url("pq/part-*.parquet"), storage_options=gcs.storage_options
            ).loader(workers=2, resident_bytes=resident) as it:
        got = [plain(b) for b in it]
        runner = it._parts.runner
        assert runner.horizons.count >= 1 and runner.stash_missed == 0
        assert runner.bytes.last is runner.bytes.stashed and runner.batches_per_task > 1
    assert got == want
    # (each file: its first read, which holds these small files whole, and one fetch)
    assert _delta(before, gcs.proxy_stats)["bytes_down"] <= sum(map(len, DATA)) * 2.1
