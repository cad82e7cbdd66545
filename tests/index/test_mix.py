"""`Dataset.mix` / `Dataset.concatenate` end to end over real ArrayRecord files: the elements
are the inputs' elements in the selected order (whatever the worker count, and what random
access says), resume is exact at any point (batch and stream mode), process shards and
elastic resume cover the mix once, and what is outside the scope is refused clearly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.errors import StateError
from aioloader.index.selection import proportions, select
from tests.support import pipeline_fns as fns

SIZES = {"a": (40, 1), "b": (25, 4), "c": (30, 1)}  # records, group size
BASE = {"a": 0, "b": 1000, "c": 2000}  # ids


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    out = {}
    for name, (count, group) in SIZES.items():
        path = root / f"{name}.array_record"
        with al.ArrayRecordWriter(str(path), group_size=group) as w:
            for i in range(count):
                rid = BASE[name] + i
                w.write(json.dumps({"id": rid, "tokens": list(range(rid % 9 + 1))}).encode())
        out[name] = str(path)
    return out


def ids(batches) -> list[int]:
    return [i for b in batches for i in np.atleast_1d(np.asarray(b["id"])).tolist()]


def run(ds, **kw) -> list:
    it = ds.loader(**kw)
    try:
        return list(it)
    finally:
        it.close()


def input_ids(ds: al.Dataset, keys) -> list[int]:
    """The ids of elements `keys` of an index-level input (random access)."""
    return [json.loads(r)["id"] for r in ds[list(keys)]] if len(keys) else []


@pytest.mark.parametrize("seed", [None, 11])
@pytest.mark.parametrize("workers", [0, 2])
def test_mix_yields_the_inputs_elements_in_the_selected_order(files, seed, workers):
    a = al.Dataset.from_arrayrecord(files["a"]).shuffle(1)
    bc = al.Dataset.from_arrayrecord([files["b"], files["c"]]).shuffle(2).repeat(2)
    mixed = al.Dataset.mix([a, bc], [1, 2], seed=seed)
    n = len(mixed)
    # Grain's length (input a's share runs out), or with a seed where a first runs out
    assert n == 120 if seed is None else 100 < n <= 120
    which, key = select(np.arange(n), proportions([1, 2], 2), seed)
    want = [0] * n
    for i, ds in enumerate([a, bc]):
        at = np.flatnonzero(which == i)
        for k, v in zip(at.tolist(), input_ids(ds, key[at].tolist()), strict=True):
            want[k] = v
    got = ids(run(mixed.map(fns.decode).map(fns.only_id_noise_det).batch(7), workers=workers))
    assert got == want
    assert [json.loads(r)["id"] for r in mixed[list(range(n))]] == want  # random access
    assert sorted(v for v in want if v < 1000) == list(range(40))  # a: each record once


def test_concatenate_then_repeat_takes_every_record_once_an_epoch_reshuffled(files):
    a = al.Dataset.from_arrayrecord(files["a"]).shuffle(4)
    b = al.Dataset.from_arrayrecord(files["b"])[::2]
    cat = al.Dataset.concatenate([a, b]).repeat(2).map(fns.decode) \
        .map(fns.only_id_noise_det).batch(10)
    got = ids(run(cat, workers=2))
    want_epoch = list(range(40)) + list(range(1000, 1025, 2))
    first, second = got[:53], got[53:]
    assert sorted(first) == sorted(second) == want_epoch
    assert first[40:] == second[40:] == list(range(1000, 1025, 2))  # in order
    assert first[:40] != second[:40]  # a's shuffle re-keyed in epoch 2 (Grain's epochs)


def test_a_nested_mix_and_a_file_in_two_inputs(files):
    a = al.Dataset.from_arrayrecord(files["a"])
    inner = al.Dataset.concatenate([a[:5], al.Dataset.from_arrayrecord(files["c"])[:5]])
    ds = al.Dataset.mix([inner, a.shuffle(3)], seed=2).map(fns.decode)
    n = len(ds)
    assert n == 20
    elems = [int(e["id"]) for e in ds[list(range(n))]]
    assert elems == ids(run(ds.map(fns.only_id_noise_det).batch(3), workers=0))
    assert sorted(e for e in elems if e >= 2000) == list(range(2000, 2005))


def _pipelines(files) -> dict[str, al.Dataset]:
    a = al.Dataset.from_arrayrecord(files["a"]).shuffle(5).repeat()
    b = al.Dataset.from_arrayrecord([files["b"], files["c"]]).shuffle(6).repeat()
    mixed = al.Dataset.mix([a, b], [0.3, 0.7], seed=3)[:160]
    return {
        "batch": mixed.map(fns.decode).random_map(fns.augment).map(fns.only_id_noise)
                      .batch(8),
        "filter": mixed.map(fns.decode).filter(fns.keep_even).map(fns.just_id),
        "pack": al.Dataset.concatenate([al.Dataset.from_arrayrecord(files["a"]).shuffle(1),
                                        al.Dataset.from_arrayrecord(files["b"])])
                  .map(fns.decode).map(fns.only_tokens)
                  .pack({"tokens": 16}, num_packing_bins=3).batch(2),
    }


def _digests(ds, state=None, **kw) -> list:
    from tests.support.state_fixture import digest

    it = ds.loader(state=state, **kw)
    try:
        return [(digest(b), it.get_state()) for b in it]
    finally:
        it.close()


@pytest.fixture(scope="module")
def references(files):
    return {name: _digests(ds) for name, ds in _pipelines(files).items()}


@pytest.mark.parametrize("name", ["batch", "filter", "pack"])
def test_workers_do_not_change_a_mix(files, references, name):
    assert [d for d, _ in _digests(_pipelines(files)[name], workers=2)] == \
        [d for d, _ in references[name]]


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["batch", "filter", "pack"]), at=st.floats(0, 1))
def test_resume_anywhere_equals_the_uninterrupted_run(files, references, name, at):
    ref = references[name]
    k = min(int(at * len(ref)), len(ref) - 1)
    state = json.loads(json.dumps(ref[k][1]))
    rest = _digests(_pipelines(files)[name], state=state)
    assert [d for d, _ in rest] == [d for d, _ in ref[k + 1:]]


def test_process_shards_and_elastic_resume_cover_the_mix_once(files, monkeypatch):
    """2 processes (told so, as jax would) stop after 3 steps; 4 resume; every element of the
    mix comes exactly once across the change."""
    pytest.importorskip("jax")
    import aioloader.jax as aljax

    a = al.Dataset.from_arrayrecord(files["a"]).shuffle(7)
    bc = al.Dataset.from_arrayrecord([files["b"], files["c"]]).shuffle(8)
    mixed = al.Dataset.mix([a, bc], [2, 3], seed=1)
    everything = [json.loads(r)["id"] for r in mixed[list(range(len(mixed)))]]
    global_batch = 8

    def run_procs(procs, state=None, stop=None):
        ds = mixed.shard_by_jax_process().map(fns.decode).map(fns.only_id_noise_det) \
            .batch(global_batch // procs, drop_remainder=True)
        outs, states = [], []
        for p in range(procs):
            monkeypatch.setattr(aljax, "process_shard", lambda ds, p=p: (p, procs))
            it = ds.loader(workers=0, state=state)
            got = []
            for k, b in enumerate(it):
                got.append(fns.ids_of(b))
                if stop is not None and k + 1 == stop:
                    break
            outs.append(got)
            states.append(it.get_state())
            it.close()
        return [i for k in range(len(outs[0])) for o in outs for i in o[k]], states[0]

    first, state = run_procs(2, stop=3)
    rest, _ = run_procs(4, state=state)
    whole = len(everything) // global_batch * global_batch
    assert first + rest == everything[:whole]  # the global batches: the mix in order


def test_to_jax_places_mixed_batches(files):
    jax = pytest.importorskip("jax")
    a = al.Dataset.from_arrayrecord(files["a"])
    ds = al.Dataset.mix([a, a.shuffle(2)]).map(fns.decode).map(fns.only_id_noise_det) \
        .batch(4, drop_remainder=True)
    got = list(ds.loader(workers=0).to_jax())
    assert all(isinstance(b["id"], jax.Array) for b in got)
    assert [int(x) for b in got for x in b["id"]] == ids(run(ds))


def test_a_mix_of_from_source_lists_with_workers():
    a = al.Dataset.from_source(list(range(5)))
    b = al.Dataset.from_source(list(range(7, 10)))
    ds = al.Dataset.mix([a, b])
    assert list(ds) == [0, 7, 1, 8, 2, 9]  # Grain's docstring example
    assert [int(x) for batch in run(ds.batch(3), workers=2) for x in batch] == list(ds)


def test_a_state_of_one_mix_does_not_resume_another(files):
    a = al.Dataset.from_arrayrecord(files["a"])
    b = al.Dataset.from_arrayrecord(files["b"])
    it = al.Dataset.mix([a, b], [1, 2]).batch(4).loader(workers=0)
    next(iter(it))
    state = it.get_state()
    it.close()
    with pytest.raises(StateError, match="different pipeline"):
        al.Dataset.mix([a, b], [2, 1]).batch(4).loader(workers=0, state=state)
    with pytest.raises(StateError, match="different pipeline"):
        al.Dataset.mix([a, b], [1, 2], seed=1).batch(4).loader(workers=0, state=state)


def test_what_cannot_be_mixed_is_refused_naming_the_input_and_why(files):
    a = al.Dataset.from_arrayrecord(files["a"])
    with pytest.raises(ValueError, match=r"input 1 .* map\(decode\).*after mixing"):
        al.Dataset.mix([a, a.map(fns.decode)])
    with pytest.raises(ValueError, match=r"input 0 .*shard the mix instead"):
        al.Dataset.concatenate([a.shard_by_jax_process(), a])
    with pytest.raises(ValueError, match=r"input 0 .*batch or pack after mixing"):
        al.Dataset.mix([a.batch(2), a])
    with pytest.raises(ValueError, match="block shuffle"):
        al.Dataset.mix([a.shuffle(1, strategy="block"), a])
    with pytest.raises(ValueError, match="block shuffle"):
        al.Dataset.mix([a, a]).shuffle(1, strategy="block")
    with pytest.raises(ValueError, match="from_source"):
        al.Dataset.mix([a, al.Dataset.from_source([b"x"])])
    other = al.Dataset.from_arrayrecord(files["b"], storage_options={"token": "anon"})
    with pytest.raises(ValueError, match="same ones"):
        al.Dataset.concatenate([a, other])
    with pytest.raises(TypeError, match="not an aioloader Dataset"):
        al.Dataset.mix([a, [b"x"]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="repeats forever"):
        len(al.Dataset.concatenate([a.repeat(), a]))
    with pytest.raises(ValueError, match="2 weights for 3"):
        al.Dataset.mix([a, a, a], [1, 2])


def test_globbed_inputs_are_told_apart_by_pattern(files, tmp_path):
    """An input's glob opens as several files: each input's records are still its own (the
    table counts records per pattern, also through an index cache)."""
    import os

    root = os.path.dirname(files["a"])
    glob = al.Dataset.from_arrayrecord(os.path.join(root, "[bc].array_record"))
    a = al.Dataset.from_arrayrecord(files["a"])
    ds = al.Dataset.concatenate([glob, a[:3], glob[:2]])
    got = [json.loads(r)["id"] for r in ds[list(range(len(ds)))]]
    assert got == [*range(1000, 1025), *range(2000, 2030), 0, 1, 2, 1000, 1001]
    assert ids(run(ds.map(fns.decode).map(fns.only_id_noise_det).batch(16))) == got
    patterns = [os.path.join(root, "[bc].array_record"), files["a"]]
    for _ in range(2):  # the second opens from the index cache
        src = al.ArrayRecordSource(patterns, index_cache_dir=tmp_path / "ix")
        try:
            assert src.table.pattern_records == (55, 40)
        finally:
            src.close()
