"""batch(pad=...) end to end: the same padded batches and states whatever the worker count,
in batch mode (padded in the worker) and stream mode (after a filter); exact resume; the
async, sync and to_jax paths; an element too long names its record."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aioloader as al
from aioloader.errors import CollateError
from tests.support import pipeline_fns as fns
from tests.support import state_fixture as fx


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return fx.write_files(tmp_path_factory.mktemp("padded"))


def pipelines(paths):
    ds = al.Dataset.from_arrayrecord(paths).shuffle(3)
    return {
        "longest": ds.repeat(2).map(fns.decode).batch(8, pad=True),
        "fixed": ds.map(fns.decode).batch(8, pad={"tokens": 8}, pad_value=-1,
                                          drop_remainder=True),
        "filter": ds.map(fns.decode).filter(fns.keep_even).batch(8, pad=True),
    }


def outputs(ds, **kw):
    with ds.loader(**kw) as it:
        return [(fx.digest(b), it.get_state()) for b in it]


@pytest.mark.parametrize("name", ["longest", "fixed", "filter"])
def test_padded_batches_and_states_do_not_depend_on_workers(paths, name):
    ds = pipelines(paths)[name]
    ref = outputs(ds, workers=0)
    assert len(ref) > 10
    assert outputs(ds, workers=2) == ref


@pytest.mark.parametrize("name", ["longest", "filter"])
def test_a_state_mid_epoch_resumes_bit_for_bit(paths, name):
    ds = pipelines(paths)[name]
    ref = outputs(ds, workers=0)
    for k in (0, 5, len(ref) // 2):
        with ds.loader(workers=2, state=ref[k][1]) as it:
            assert [fx.digest(b) for b in it] == [d for d, _ in ref[k + 1:]]


def test_the_batches_hold_the_records_padded_and_masked(paths):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).batch(8, pad={"tokens": 8},
                                                                  pad_value=-1)
    batches = list(ds.loader(workers=2))
    for b in batches:
        assert b["tokens"].shape == (len(b["id"]), 8) and b["tokens_mask"].dtype == bool
        for row, mask, rid in zip(b["tokens"], b["tokens_mask"], b["id"]):
            n = int(rid) % 7 + 1  # the fixture's record `rid` holds tokens 0..n-1
            assert row.tolist() == list(range(n)) + [-1] * (8 - n)
            assert mask.tolist() == [True] * n + [False] * (8 - n)
    assert sum(len(b["id"]) for b in batches) == 240


async def test_the_async_path_gives_the_sync_batches(paths):
    ds = pipelines(paths)["filter"]
    async with ds.loader(workers=2) as it:
        got = [fx.digest(b) async for b in it]
    assert got == [d for d, _ in outputs(ds, workers=0)]


def test_to_jax_puts_the_padded_batches_and_masks_on_the_device(paths):
    pytest.importorskip("jax")
    ds = pipelines(paths)["fixed"]
    host = list(ds.loader(workers=0))
    dev = list(ds.loader(workers=2).to_jax())
    assert len(dev) == len(host)
    for h, d in zip(host, dev):
        assert set(d) == {"id", "tokens", "tokens_mask"}
        np.testing.assert_array_equal(np.asarray(d["tokens"]), h["tokens"])
        np.testing.assert_array_equal(np.asarray(d["tokens_mask"]), h["tokens_mask"])


@pytest.mark.parametrize("workers", [0, 2])
def test_an_element_longer_than_its_length_names_the_field_and_record(paths, workers):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).batch(8, pad={"tokens": 3})
    with pytest.raises(CollateError, match=r"element\['tokens'\] to 3, but element \d+ has "
                                           r"\d+.*record \d+ \(epoch 0\) in .*part-0"):
        list(ds.loader(workers=workers))


def test_the_graph_shows_the_padded_stage(paths):
    graph = pipelines(paths)["fixed"].graph()
    assert "batch(8, drop_remainder, pad={'tokens': 8}, pad_value=-1)" in graph
    assert "'tokens': int32[8, 8], 'tokens_mask': bool[8, 8]" in graph


def test_a_state_of_another_padding_is_refused(paths):
    ds = pipelines(paths)["fixed"]
    with ds.loader(workers=0) as it:
        next(iter(it))
        state = it.get_state()
    other = al.Dataset.from_arrayrecord(paths).shuffle(3).map(fns.decode).batch(
        8, pad={"tokens": 9}, pad_value=-1, drop_remainder=True)
    with pytest.raises(al.StateError, match="different pipeline"):
        asyncio.run(_first(other, state))


async def _first(ds, state):
    async with ds.loader(workers=0, state=state) as it:
        return await it.__anext__()
