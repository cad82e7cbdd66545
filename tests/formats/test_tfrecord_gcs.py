"""TFRecord files in a bucket (the local GCS emulator, over real HTTP through gcsfs and our
client): the same records as locally; opening scans each file with sequential window reads
(a small file named alone: the one request that opens any file); with an index cache a
second open reads no file bytes; damage names the gs:// object and the record."""

from __future__ import annotations

import dataclasses
import json

import pytest

import aioloader as al
from aioloader.formats.tfrecord import TFRecordFormatError, frame
from aioloader.testing import ProxyStats, local_gcs

RECORDS = [[json.dumps({"id": k * 1000 + i, "pad": "x" * (i % 50)}).encode()
            for i in range(400)] for k in range(3)]


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True) as bucket:
        for k, records in enumerate(RECORDS):
            bucket.upload_bytes(b"".join(map(frame, records)), f"tf/part-{k}.tfrecord")
        big = b"".join(frame(b"%06d" % i + b"y" * 1000) for i in range(1000))  # ~1 MB
        bucket.upload_bytes(big, "tf/big.tfrecord")
        yield bucket


def _delta(before: ProxyStats, after: ProxyStats) -> dict[str, int]:
    return {f.name: getattr(after, f.name) - getattr(before, f.name)
            for f in dataclasses.fields(ProxyStats)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_glob_in_a_bucket_reads_the_same_records(gcs, workers):
    ds = al.Dataset.from_tfrecord(gcs.url("tf/part-*.tfrecord"),
                                  storage_options=gcs.storage_options)
    assert list(ds.loader(workers=workers)) == [r for rs in RECORDS for r in rs]
    ids = [json.loads(r)["id"] for r in ds.shuffle(seed=2).loader(workers=workers)]
    assert sorted(ids) == sorted(k * 1000 + i for k in range(3) for i in range(400))


def test_files_beam_wrote_read_from_a_bucket(gcs, tmp_path):
    beam = pytest.importorskip("apache_beam", reason="Beam is the oracle")
    from apache_beam.options.pipeline_options import PipelineOptions

    records = [r for rs in RECORDS for r in rs]
    with beam.Pipeline(runner="DirectRunner", options=PipelineOptions([])) as p:
        _ = (p | beam.Create(records)
             | beam.io.WriteToTFRecord(str(tmp_path / "b"), file_name_suffix=".tfrecord",
                                       num_shards=2))
    for f in sorted(tmp_path.glob("b-*.tfrecord")):
        gcs.upload(f, f"beam/{f.name}")
    ds = al.Dataset.from_tfrecord(gcs.url("beam/b-*.tfrecord"),
                                  storage_options=gcs.storage_options)
    got = list(ds.loader(workers=0))
    assert sorted(got) == sorted(records)
    local = list(al.Dataset.from_tfrecord(str(tmp_path / "b-*.tfrecord")).loader(workers=0))
    assert got == local


def test_a_small_named_file_opens_in_one_request(gcs):
    before = gcs.proxy_stats
    with al.TFRecordSource(gcs.url("tf/part-1.tfrecord"),
                           storage_options=gcs.storage_options) as src:
        assert len(src) == 400
        assert _delta(before, gcs.proxy_stats)["downloads"] == 1
        assert src[17] == RECORDS[1][17]


def test_a_large_file_is_scanned_in_sequential_windows(gcs):
    url = gcs.url("tf/big.tfrecord")
    ds = al.Dataset.from_tfrecord(url, storage_options=gcs.storage_options)
    before = gcs.proxy_stats
    got = list(ds.loader(workers=0, memory_budget=1 << 20))  # windows of 256 KiB
    assert [g[:6] for g in got] == [b"%06d" % i for i in range(1000)]
    assert _delta(before, gcs.proxy_stats)["downloads"] >= 5  # the scan's windows, then reads


def test_the_index_cache_spares_a_second_scan(gcs, tmp_path):
    url = gcs.url("tf/part-*.tfrecord")
    kw = dict(storage_options=gcs.storage_options, index_cache_dir=tmp_path / "idx")
    with al.TFRecordSource(url, **kw) as src:
        assert not src.table.from_index_cache
    before = gcs.proxy_stats
    with al.TFRecordSource(url, **kw) as src:
        assert len(src) == 1200 and src.table.from_index_cache
        assert _delta(before, gcs.proxy_stats)["downloads"] == 0  # a listing only
        assert src[401] == RECORDS[1][1]


def test_a_damaged_object_names_its_url_and_record(gcs):
    data = bytearray(b"".join(frame(b"rec-%02d" % i) for i in range(20)))
    data[5 * 22 + 12] ^= 0x01  # record 5's payload
    url = gcs.upload_bytes(bytes(data), "tf/bad.tfrecord")
    ds = al.Dataset.from_tfrecord(url, storage_options=gcs.storage_options)
    with pytest.raises(TFRecordFormatError, match=r"bad\.tfrecord, record 5, byte 110"):
        list(ds.loader(workers=0))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_disk_and_memory_tiers_serve_tfrecord(gcs, tmp_path, workers):
    ds = al.Dataset.from_tfrecord(gcs.url("tf/part-*.tfrecord"),
                                  storage_options=gcs.storage_options).shuffle(seed=1).repeat(2)
    want = [r for rs in RECORDS for r in rs]
    for kw in ({"cache_dir": tmp_path / f"disk{workers}", "resident_bytes": 0},
               {"resident_bytes": 64 << 20}):
        got = list(ds.loader(workers=workers, **kw))
        assert sorted(got[:1200]) == sorted(got[1200:]) == sorted(want)
