"""TFRecord files read by the loader, with Apache Beam's TFRecord IO as the oracle: files Beam
writes (DirectRunner), read with the same records, in the same order as a plain sequential
read; and everything a pipeline does over ArrayRecord files works over them (exact and block
shuffle, repeat, shard, resume bit for bit, elastic resume, read instructions, a mix with
ArrayRecord files, the index cache, graph()); damage is an error naming file and record."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import aioloader as al
from aioloader.formats.tfrecord import TFRecordFormatError, frame
from aioloader.tools.convert import read_tfrecord
from tests.support import pipeline_fns as fns
from tests.support.elastic import elastic_ids, resumed

beam = pytest.importorskip("apache_beam", reason="Beam is the oracle")

from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

N = 600
RECORDS = [json.dumps({"id": i, "tokens": list(range(i % 13))}).encode() for i in range(N)]


def _pipeline() -> beam.Pipeline:
    return beam.Pipeline(runner="DirectRunner", options=PipelineOptions([]))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """Beam's three TFRecord shards of RECORDS, and the same records as one ArrayRecord file."""
    root = tmp_path_factory.mktemp("tfrecord")
    with _pipeline() as p:
        _ = (p | beam.Create(RECORDS)
             | beam.io.WriteToTFRecord(str(root / "train"), file_name_suffix=".tfrecord",
                                       num_shards=3))
    shards = sorted(str(x) for x in root.glob("train-*.tfrecord"))
    assert len(shards) == 3
    with al.ArrayRecordWriter(root / "same.array_record", group_size=1) as w:
        for r in RECORDS:
            w.write(r)
    return {"glob": str(root / "train-*.tfrecord"), "shards": shards,
            "ar": str(root / "same.array_record"), "root": root}


def _sequential(shards: list[str]) -> list[bytes]:
    """The files' records in file order, by the converter's own stream reader."""
    out: list[bytes] = []
    for s in shards:
        with open(s, "rb") as f:
            out += list(read_tfrecord(f, s, size=Path(s).stat().st_size))
    return out


def _ids(ds: al.Dataset, **kw) -> list[int]:
    return [int(json.loads(r)["id"]) for r in ds.loader(**kw)]


@pytest.mark.parametrize("workers", [0, 2])
def test_files_beam_wrote_read_back_with_the_same_records(files, workers):
    got = list(al.Dataset.from_tfrecord(files["glob"]).loader(workers=workers))
    assert got == _sequential(files["shards"])
    assert Counter(got) == Counter(RECORDS)


def test_records_we_read_are_the_ones_beam_reads(files):
    with al.TFRecordSource(files["glob"]) as src:
        ours = list(src)
    with _pipeline() as p:
        theirs = p | beam.io.ReadFromTFRecord(files["glob"])
        assert_that(theirs, equal_to(ours))


def test_exact_shuffle_covers_each_record_once_per_epoch(files):
    ds = al.Dataset.from_tfrecord(files["glob"]).shuffle(seed=3).repeat(2)
    got = _ids(ds, workers=2)
    first, second = got[:N], got[N:]
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second  # re-keyed per epoch
    assert got == _ids(ds, workers=0)  # whatever executes it


def test_block_shuffle_covers_each_record_once(files):
    ds = al.Dataset.from_tfrecord(files["glob"]).shuffle(
        seed=5, strategy="block", block_bytes=2048, window_bytes=8192)
    got = _ids(ds, workers=0)
    assert sorted(got) == list(range(N)) and got != sorted(got)


def test_shards_split_the_records(files):
    ds = al.Dataset.from_tfrecord(files["glob"]).shuffle(seed=1)
    parts = [_ids(ds.shard(k, 3), workers=0) for k in range(3)]
    assert sorted(i for part in parts for i in part) == list(range(N))


def _pipeline_of(files) -> al.Dataset:
    return (al.Dataset.from_tfrecord(files["glob"]).shuffle(seed=9).repeat(2)
            .map(fns.decode).map(fns.just_id).batch(16, drop_remainder=True))


@pytest.mark.parametrize("at", [0, 7, 41])
def test_resume_is_bit_for_bit(files, at):
    whole, rest, _ = resumed(_pipeline_of(files), at)
    assert rest == whole[at + 1:]


def test_elastic_resume_covers_every_record_once(files, monkeypatch):
    """2 processes (told so, as jax would) stop after 3 steps; 3 resume; every record comes
    once in the epoch across the change."""
    pytest.importorskip("jax")
    base = al.Dataset.from_tfrecord(files["glob"]).shuffle(seed=4)
    got = elastic_ids(monkeypatch, lambda procs: base.shard_by_jax_process().map(fns.decode)
                      .map(fns.just_id).batch(12 // procs, drop_remainder=True))
    assert len(got) == len(set(got)) == N // 12 * 12


def test_a_read_instruction_takes_records_of_one_file(files):
    shard = files["shards"][1]
    records = _sequential([shard])
    assert list(al.Dataset.from_tfrecord(f"{shard}[3:10]").loader(workers=0)) == records[3:10]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_and_a_concatenation_with_arrayrecord_files(files, workers):
    tf = al.Dataset.from_tfrecord(files["glob"])
    ar = al.Dataset.from_arrayrecord(files["ar"])
    both = al.Dataset.concatenate([tf, ar])
    got = list(both.loader(workers=workers))
    assert got == _sequential(files["shards"]) + RECORDS
    mixed = al.Dataset.mix([tf.shuffle(1), ar.shuffle(2)], [1, 1]).shuffle(seed=3)
    ids = _ids(mixed, workers=workers)
    assert Counter(ids) == Counter({i: 2 for i in range(N)})
    assert "tfrecord" in mixed.describe()[0]


def test_graph_and_stats_name_the_format(files):
    ds = al.Dataset.from_tfrecord(files["glob"]).map(fns.decode).map(fns.just_id).batch(4)
    assert ds.describe()[0].startswith("tfrecord(")
    assert "tfrecord(" in ds.graph()
    with ds.loader(workers=0) as it:
        next(iter(it))
        assert "tfrecord(" in str(it.stats())
    assert al.Dataset.from_arrayrecord(files["ar"]).describe()[0].startswith("source(")


def test_a_source_travels_with_its_format(files):
    import pickle

    with al.TFRecordSource(files["glob"]) as src, \
            pickle.loads(pickle.dumps(src)) as copy:
        assert copy[5] == src[5]
        ds = al.Dataset.from_source(src)
        assert list(ds.loader(workers=0)) == list(src)


def test_the_index_cache_keeps_the_scan(files, tmp_path):
    cache = tmp_path / "idx"
    with al.TFRecordSource(files["glob"], index_cache_dir=cache) as src:
        assert not src.table.from_index_cache
        first = list(src)
    with al.TFRecordSource(files["glob"], index_cache_dir=cache) as src:
        assert src.table.from_index_cache
        assert list(src) == first
    # the same files read as ArrayRecord do not take the TFRecord entry
    with pytest.raises(al.ArrayRecordFormatError), \
            al.ArrayRecordSource(files["glob"], index_cache_dir=cache) as src:
        len(src)


def test_a_rewritten_file_is_scanned_again(tmp_path):
    path = tmp_path / "one.tfrecord"
    path.write_bytes(b"".join(frame(b"%04d" % i) for i in range(50)))
    cache = tmp_path / "idx"
    with al.TFRecordSource(str(path), index_cache_dir=cache) as src:
        assert src[7] == b"0007"
    path.write_bytes(b"".join(frame(b"x%03d" % i) for i in range(50)))  # same size
    with al.TFRecordSource(str(path), index_cache_dir=cache) as src:
        assert not src.table.from_index_cache and src[7] == b"x007"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_payload_names_the_file_and_record(tmp_path, workers):
    path = tmp_path / "bad.tfrecord"
    data = bytearray(b"".join(frame(b"record-%03d" % i) for i in range(40)))
    at = 17 * (16 + 10)  # record 17's offset
    data[at + 12 + 3] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(TFRecordFormatError) as got:
        list(al.Dataset.from_tfrecord(str(path)).loader(workers=workers))
    assert f"bad.tfrecord, record 17, byte {at}" in str(got.value)
    assert "checksum" in str(got.value)
    kept = list(al.Dataset.from_tfrecord(str(path), verify="headers").loader(workers=workers))
    assert kept[17] != b"record-017" and len(kept) == 40


def test_an_empty_shard_holds_no_records_and_the_others_are_read(tmp_path):
    (tmp_path / "a-0.tfrecord").write_bytes(b"".join(frame(b"r%d" % i) for i in range(5)))
    (tmp_path / "a-1.tfrecord").write_bytes(b"")  # an empty shard, as TensorFlow writes
    (tmp_path / "a-2.tfrecord").write_bytes(b"".join(frame(b"s%d" % i) for i in range(3)))
    ds = al.Dataset.from_tfrecord(str(tmp_path / "a-*.tfrecord"))
    got = list(ds.loader(workers=0))
    assert got == [b"r%d" % i for i in range(5)] + [b"s%d" % i for i in range(3)]
    assert sorted(ds.shuffle(3).loader(workers=0)) == sorted(got)


def test_hostile_files_fail_at_open_naming_the_file(tmp_path):
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(b"".join(frame(b"r%d" % i) for i in range(10))[:-3])
    with pytest.raises(TFRecordFormatError, match=r"cut.tfrecord, record 9, byte \d+"), \
            al.TFRecordSource(str(cut)) as src:
        len(src)


def test_random_access_gives_what_the_loader_yields(files):
    ds = al.Dataset.from_tfrecord(files["glob"]).shuffle(seed=6)
    every = list(ds.loader(workers=0))
    assert len(ds) == N
    assert ds[[0, 17, N - 1]] == [every[0], every[17], every[N - 1]]


def test_small_and_empty_shards_take_the_index_cache(tmp_path):
    (tmp_path / "t-0.tfrecord").write_bytes(b"".join(frame(b"r%d" % i) for i in range(10)))
    (tmp_path / "t-1.tfrecord").write_bytes(b"")  # an empty shard
    (tmp_path / "t-2.tfrecord").write_bytes(frame(b"tiny"))  # shorter than a head's read
    cache = tmp_path / "idx"
    want = [b"r%d" % i for i in range(10)] + [b"tiny"]
    for hit in (False, True):
        with al.TFRecordSource(str(tmp_path / "t-*.tfrecord"), index_cache_dir=cache) as src:
            assert src.table.from_index_cache is hit
            assert list(src) == want
