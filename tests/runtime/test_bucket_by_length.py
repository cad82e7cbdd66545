"""bucket_by_length() end to end: the same padded batches and states whatever the worker
count and window; a state from anywhere mid-epoch resumes bit for bit; its state is a few
integers; what it cannot do (move to another process count, a bad length) is said."""

from __future__ import annotations

import numpy as np
import pytest

import aioloader as al
from aioloader.describe.state import LoaderState, merge_states
from aioloader.errors import StateError, TransformError
from tests.support import pipeline_fns as fns
from tests.support import state_fixture as fx


def n_tokens(element: dict) -> int:
    return len(element["tokens"])


def bad_length(element: dict) -> float:
    return 2.5


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return fx.write_files(tmp_path_factory.mktemp("buckets"))


def pipelines(paths):
    ds = al.Dataset.from_arrayrecord(paths).shuffle(3)
    return {
        "buckets": ds.repeat(2).map(fns.decode).bucket_by_length(n_tokens, [3, 6], [4, 3, 5]),
        "filter_drop": ds.map(fns.decode).filter(fns.keep_even).bucket_by_length(
            n_tokens, [2, 5], [3, 2, 4], pad={"tokens": 8}, pad_value=-1, drop_remainder=True),
    }


def outputs(ds, **kw):
    with ds.loader(**kw) as it:
        return [(fx.digest(b), it.get_state()) for b in it]


@pytest.mark.parametrize("name", ["buckets", "filter_drop"])
def test_batches_and_states_do_not_depend_on_workers_or_window(paths, name):
    ds = pipelines(paths)[name]
    ref = outputs(ds, workers=0)
    assert len(ref) > 10
    assert outputs(ds, workers=2) == ref
    assert [d for d, _ in outputs(ds, workers=2, window=7)] == [d for d, _ in ref]


@pytest.mark.parametrize("name", ["buckets", "filter_drop"])
def test_a_state_mid_epoch_resumes_bit_for_bit(paths, name):
    ds = pipelines(paths)[name]
    ref = outputs(ds, workers=0)
    for k in (0, len(ref) // 3, 2 * len(ref) // 3, len(ref) - 2):
        state = ref[k][1]
        assert set(state) <= {"version", "position", "skip", "rows", "unit", "process_count",
                              "pipeline", "buckets"}
        assert len(state.get("buckets", [])) in (0, 3)
        with ds.loader(workers=2, state=state) as it:
            assert [(fx.digest(b), it.get_state()) for b in it] == ref[k + 1:], k


async def test_a_state_set_on_a_running_loader_with_another_window(paths):
    ds = pipelines(paths)["buckets"]
    ref = outputs(ds, workers=0)
    k = len(ref) // 2
    async with ds.loader(window=64, workers=1) as it:
        await it.__anext__()
        it.set_state(ref[k][1])
        assert [(fx.digest(b), it.get_state()) async for b in it] == ref[k + 1:]


def test_each_batch_is_one_bucket_padded_and_every_element_comes_once(paths):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).bucket_by_length(
        n_tokens, [3, 6], [4, 3, 5])
    ids = []
    for b in ds.loader(workers=2):
        lengths = b["tokens_mask"].sum(axis=1)
        buckets = {int(np.searchsorted([3, 6], n, side="right")) for n in lengths}
        assert len(buckets) == 1 and b["tokens"].shape[1] == lengths.max()
        for row, n, rid in zip(b["tokens"], lengths, b["id"]):
            assert n == int(rid) % 7 + 1 and row[:n].tolist() == list(range(n))
        ids += b["id"].tolist()
    assert sorted(ids) == sorted(i + 1000 * f for f, c in enumerate([150, 90])
                                 for i in range(c))


def test_a_state_does_not_move_to_another_process_count(paths):
    ds = pipelines(paths)["buckets"]
    state = outputs(ds, workers=0)[3][1]
    two = merge_states([{**state, "process_count": 2}, {**state, "process_count": 2}])
    moved = LoaderState.from_json(two)
    assert moved.resume_as(state["pipeline"], state["unit"], 2, False, 1).buckets == \
        tuple(state.get("buckets", ()))  # the same count: each process its own place
    with pytest.raises(StateError, match=r"bucket_by_length.*cannot move to another process"):
        moved.resume_as(state["pipeline"], state["unit"], 3, False, 0)


def test_a_single_process_state_resumes_only_on_its_own_process_count(paths):
    state = outputs(pipelines(paths)["buckets"], workers=0)[3][1]
    with pytest.raises(StateError, match=r"bucket_by_length\(\) state from 1 processes cannot "
                                         r"resume on 2: .* only on the same process count"):
        LoaderState.from_json(state).resume_as(state["pipeline"], state["unit"], 2, False, 0)


@pytest.mark.parametrize("batch", [True, False])
def test_a_stray_buckets_field_is_refused_without_buckets(paths, batch):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode)
    ds = (ds if batch else ds.filter(fns.keep_even)).batch(4, pad=True)
    state = {**outputs(ds, workers=0)[3][1], "buckets": [0, 2, 0]}
    with pytest.raises(StateError, match="'buckets', which only a pipeline with "
                                         r"bucket_by_length\(\) saves"), \
            ds.loader(workers=0, state=state) as it:
        next(iter(it))


@pytest.mark.parametrize("buckets, match", [
    ("x", "'buckets' must be a list"), ([1, -1, 0], "'buckets' must be a list"),
    ([1, 2], "'buckets' has 2 counts, but bucket_by_length"),
    ([0, 10**6, 0], r"'buckets' says \d+ more elements of buckets \[1\] were delivered"),
])
def test_a_bad_buckets_field_is_refused(paths, buckets, match):
    ds = pipelines(paths)["buckets"]
    state = {**outputs(ds, workers=0)[3][1], "buckets": buckets}
    with pytest.raises(StateError, match=match), ds.loader(workers=0, state=state) as it:
        next(iter(it))


def test_a_bad_length_names_the_element(paths):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).bucket_by_length(
        bad_length, [3], [2, 2])
    with pytest.raises(TransformError, match=r"length_fn raised TypeError: length_fn must "
                                             r"return an int, got 2.5 .*on element 0 of the "
                                             r"window at output position 0"):
        list(ds.loader(workers=2))


def test_to_jax_puts_the_buckets_batches_on_the_device(paths):
    pytest.importorskip("jax")
    ds = pipelines(paths)["filter_drop"]
    host = list(ds.loader(workers=0))
    dev = list(ds.loader(workers=2).to_jax())
    assert len(dev) == len(host)
    for d, h in zip(dev, host):  # (ids come back as jax's default int width)
        assert set(d) == set(h) == {"id", "tokens", "tokens_mask"}
        for k in h:
            np.testing.assert_array_equal(np.asarray(d[k]), h[k])


def test_the_graph_shows_the_buckets(paths):
    graph = pipelines(paths)["filter_drop"].graph()
    assert ("bucket_by_length(n_tokens, boundaries=[2, 5], batch_sizes=[3, 2, 4], "
            "drop_remainder, pad={'tokens': 8}, pad_value=-1): {'id': int64[") in graph
    assert "'tokens_mask': bool[" in graph
