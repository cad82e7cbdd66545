"""Random access into a pipeline (issue 16 item 1): `ds[i]` is the loader's i-th element."""

from __future__ import annotations

import json

import numpy as np
import pytest

import aioloader as al

from ..runtime.test_pipeline import _write


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("access"), n=240)


def parse(record):
    return json.loads(record)["id"]


def noisy(i, rng):
    return (i, int(rng.integers(0, 1 << 30)))


def _pipeline(data):
    return (al.Dataset.from_arrayrecord(data).shuffle(11).repeat(3).shard(1, 2)[5:300]
            .map(parse).random_map(noisy, seed=4))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_position_is_the_loaders_element(data, workers):
    ds = _pipeline(data)
    got = list(ds.loader(workers=workers))
    assert len(ds) == len(got) == 295
    assert [ds[i] for i in range(len(ds))] == got
    assert ds[-1] == got[-1]
    assert ds[[7, 3, 7]] == [got[7], got[3], got[7]]
    assert ds.__getitems__(np.array([0, 294])) == [got[0], got[294]]


def test_iteration_uses_a_loader_and_len_counts_records(data):
    ds = al.Dataset.from_arrayrecord(data).map(parse)
    assert len(ds) == 240
    assert sorted(ds) == list(range(240))
    assert ds[0] == 0 and ds[1] == 3  # files in order (file k holds ids k, k+3, ...)
    assert bool(ds)


def test_block_shuffle_positions_match_too(data):
    ds = al.Dataset.from_arrayrecord(data).shuffle(3, strategy="block", block_bytes=2048,
                                                   window_bytes=8192).map(parse)
    assert [ds[i] for i in range(len(ds))] == list(ds.loader(workers=0))


@pytest.mark.parametrize(("build", "says"), [
    (lambda ds: ds.filter(lambda x: True), r"a filter\(\)"),
    (lambda ds: ds.batch(4), r"batch\(\) groups"),
    (lambda ds: ds.map(json.loads).pack({"tokens": 8}, num_packing_bins=2), r"pack\(\) groups"),
])
def test_pipelines_that_are_not_one_to_one_say_why(data, build, says):
    ds = build(al.Dataset.from_arrayrecord(data))
    with pytest.raises(TypeError, match=f"cannot be indexed: {says}"):
        ds[0]
    with pytest.raises(TypeError, match="cannot be indexed"):
        len(ds)


def test_an_infinite_stream_has_no_len_but_a_slice_of_it_has(data):
    once = al.Dataset.from_arrayrecord(data).map(parse)
    ds = al.Dataset.from_arrayrecord(data).repeat().map(parse)
    with pytest.raises(TypeError, match="repeats forever"):
        len(ds)
    assert ds[1000] == once[1000 % 240]  # positions still work
    head = ds[:500]
    assert len(head) == 500 and list(head.loader(workers=0))[-1] == once[499 % 240]


def test_out_of_range_is_an_index_error(data):
    ds = al.Dataset.from_arrayrecord(data)
    with pytest.raises(IndexError):
        ds[240]


@pytest.mark.parametrize("key", ["0", 1.5, None])
def test_a_key_that_is_no_position_is_a_type_error(data, key):
    with pytest.raises(TypeError, match="index a Dataset with an int, a list of ints or a slice"):
        al.Dataset.from_arrayrecord(data)[key]
