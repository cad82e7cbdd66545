"""flat_map: one record to any number of elements, in order (input order, then expansion
order) whatever the workers or window, composed with the other verbs, and exact resume at
any output, mid-expansion included."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.errors import TransformError
from tests.support import pipeline_fns as fns
from tests.support import state_fixture as fx


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return fx.write_files(tmp_path_factory.mktemp("flat"))


def _expected(paths, ids_order=None):
    """(id, k) of every element of `map(decode).flat_map(split_tokens)`, computed here."""
    src = al.ArrayRecordSource(paths)
    try:
        recs = [json.loads(r) for r in src[list(range(len(src)))]]
    finally:
        src.close()
    by_id = {r["id"]: r for r in recs}
    order = ids_order if ids_order is not None else [r["id"] for r in recs]
    return [(i, k) for i in order for k in range(len(by_id[i]["tokens"]) - 1)]


def outputs(ds, **kw):
    it = ds.loader(**kw)
    try:
        return [(fx.digest(b), it.get_state()) for b in it]
    finally:
        it.close()


def pipelines(paths):
    ds = al.Dataset.from_arrayrecord(paths)
    flat = ds.map(fns.decode).flat_map(fns.split_tokens)
    return {
        "elements": flat.map(fns.id_k),
        "shuffle_repeat_batch": ds.shuffle(4).repeat(2).map(fns.decode)
                                  .flat_map(fns.split_tokens).map(fns.id_k).batch(8),
        "filter_random_batch": flat.filter(fns.not_k2).random_map(fns.augment)
                                   .map(fns.id_k_noise).batch(5, drop_remainder=True),
        "pack": flat.map(fns.only_tokens).pack({"tokens": 16}, num_packing_bins=3).batch(2),
    }


def test_elements_come_in_input_then_expansion_order(paths):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).flat_map(fns.split_tokens)
    got = [(int(e["id"]), int(e["k"])) for e in ds.loader(workers=0)]
    assert got == _expected(paths)
    assert len(got) > 240  # records expand (and some to nothing: one token)


def test_a_transform_class_and_grain_shape_are_accepted(paths):
    class Split(al.FlatMap):
        def flat_map(self, element):
            return fns.split_tokens(element)

    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).flat_map(Split())
    assert "flat_map(" in ds.describe()[-1]
    assert len(list(ds.map(fns.id_k).loader(workers=0))) == len(_expected(paths))


@pytest.mark.parametrize("name", ["elements", "shuffle_repeat_batch", "filter_random_batch",
                                  "pack"])
def test_outputs_and_states_do_not_depend_on_workers_or_window(paths, name):
    ds = pipelines(paths)[name]
    ref = outputs(ds, workers=0)
    assert len(ref) > 10
    assert outputs(ds, workers=2) == ref
    assert [d for d, _ in outputs(ds, workers=1, window=3)] == [d for d, _ in ref]


def test_random_map_after_flat_map_keys_each_element(paths):
    ds = (al.Dataset.from_arrayrecord(paths).map(fns.decode).flat_map(fns.split_tokens)
          .random_map(fns.augment, seed=3))
    got = list(ds.loader(workers=0))
    noise = [int(e["noise"]) for e in got]
    assert len(set(noise)) == len(noise)  # not one generator per record


@pytest.mark.parametrize("name", ["elements", "shuffle_repeat_batch", "filter_random_batch",
                                  "pack"])
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_resume_at_any_output_equals_the_uninterrupted_run(paths, name, data):
    window = data.draw(st.sampled_from([4, 64, 1024]), label="window")
    ds = pipelines(paths)[name]
    ref = _REF.setdefault((name, window), outputs(ds, workers=0, window=window))
    k = data.draw(st.integers(0, len(ref) - 1), label="after")
    state = json.loads(json.dumps(ref[k][1]))
    assert [d for d, _ in outputs(ds, workers=0, state=state)] == [d for d, _ in ref[k + 1:]]


_REF: dict = {}


def test_a_state_mid_expansion_resumes_with_the_next_element(paths):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).flat_map(fns.split_tokens) \
        .map(fns.id_k)
    it = ds.loader(workers=0, window=1)  # a window is one record: skip counts its elements
    seen = []
    for e in it:
        seen.append((int(e["id"]), int(e["k"])))
        if seen[-1][1] == 2 and len(seen) > 20:
            break
    state = it.get_state()
    it.close()
    assert state["skip"] == 3  # 3 of that record's elements handed out
    rest = [(int(e["id"]), int(e["k"])) for e in ds.loader(workers=2, state=state)]
    assert seen + rest == _expected(paths)


def test_to_jax_takes_flat_map_batches(paths):
    pytest.importorskip("jax")
    ds = pipelines(paths)["shuffle_repeat_batch"]
    host = [np.asarray(b["id"]) for b in ds.loader(workers=0)]
    dev = [np.asarray(b["id"]) for b in ds.loader(workers=0).to_jax()]
    assert len(dev) == len(host) and all((a == b).all() for a, b in zip(dev, host))


def test_indexing_is_refused_with_the_reason(paths):
    ds = al.Dataset.from_arrayrecord(paths).flat_map(lambda r: [r, r])
    with pytest.raises(TypeError, match="flat_map"):
        ds[0]
    with pytest.raises(TypeError, match="flat_map"):
        len(ds)


def test_a_flat_map_returning_a_string_or_a_non_iterable_names_it(paths):
    ds = al.Dataset.from_arrayrecord(paths)
    with pytest.raises(TransformError, match=r"flat_map\(.*wrap one element in a list"):
        list(ds.flat_map(lambda r: r.decode()).loader(workers=0))
    with pytest.raises(TransformError, match="iterable of elements"):
        list(ds.flat_map(lambda r: 3).loader(workers=0))


def test_a_lambda_flat_map_travels_to_workers(paths):
    ds = al.Dataset.from_arrayrecord(paths).flat_map(lambda r: [len(r)] * 2)
    assert list(ds.loader(workers=2)) == list(ds.loader(workers=0))
