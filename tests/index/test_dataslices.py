"""Data slices: which rows of every global batch each JAX process loads.

The table is pure (`aioloader.index.dataslices.slice_table`), so its property is checked on random
meshes of simulated processes; what a loader does with it on one real process, and with a
process count it cannot serve, runs here; real multi-process runs are in test_multihost.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.index.dataslices import LayoutError, shard_of, slice_table

from ..runtime.test_pipeline import _write
from ..support import pipeline_fns as fns


@st.composite
def meshes(draw):
    """(device rows, process count): P processes of L devices laid out on a (D, M) mesh in a
    random order, each device holding block d of the D blocks of the batch axis."""
    processes = draw(st.integers(1, 4))
    local = draw(st.sampled_from([1, 2, 4]))
    total = processes * local
    data = draw(st.sampled_from([d for d in range(1, total + 1) if total % d == 0]))
    order = draw(st.permutations(range(total)))
    rows = []
    for position, device in enumerate(order):
        block = position // (total // data)  # row-major (D, M) grid: data index
        rows.append((device // local, block, block + 1))
    return rows, processes


def _served(rows, processes):
    """The oracle: each process's blocks one range; the distinct ranges equal and disjoint."""
    spans = {}
    for p in range(processes):
        blocks = sorted({(a, b) for q, a, b in rows if q == p})
        if [a for a, _ in blocks] != list(range(blocks[0][0], blocks[-1][0] + 1)):
            return None
        spans[p] = (blocks[0][0], blocks[-1][1])
    distinct = sorted(set(spans.values()))
    widths = {b - a for a, b in distinct}
    ends = [b for _, b in distinct]
    if len(widths) != 1 or [a for a, _ in distinct] != [0, *ends[:-1]]:
        return None
    return spans


@settings(max_examples=200, deadline=None)
@given(meshes())
def test_processes_of_one_slice_share_a_shard_and_the_shards_tile_the_batch(mesh):
    rows, processes = mesh
    spans = _served(rows, processes)
    if spans is None:
        with pytest.raises(LayoutError):
            slice_table(rows, processes)
        return
    table = slice_table(rows, processes)
    count = max(table) + 1
    assert sorted(set(table)) == list(range(count))
    for p in range(processes):
        for q in range(processes):
            assert (table[p] == table[q]) == (spans[p] == spans[q])
        index, n = shard_of(table, p, processes)
        width = spans[p][1] - spans[p][0]
        assert n == count and spans[p] == (index * width, (index + 1) * width)


def test_the_layouts_of_the_issue():
    # 4 processes x 1 device, ('data', 'model') = (2, 2): replicas {0, 1} and {2, 3}
    assert slice_table([(0, 0, 1), (1, 0, 1), (2, 1, 2), (3, 1, 2)], 4) == (0, 0, 1, 1)
    # 'model' within each process: one slice each; fully replicated: one slice for all
    assert slice_table([(0, 0, 1), (0, 0, 1), (1, 1, 2), (1, 1, 2)], 2) == (0, 1)
    assert slice_table([(0, 0, 4), (1, 0, 4)], 2) == (0, 0)
    with pytest.raises(LayoutError, match="not one contiguous range"):
        slice_table([(0, 0, 1), (1, 1, 2), (0, 2, 3), (1, 3, 4)], 2)
    with pytest.raises(LayoutError, match="unequal or overlapping"):
        slice_table([(0, 0, 1), (1, 1, 2), (1, 2, 3), (1, 3, 4)], 2)
    with pytest.raises(LayoutError, match=r"processes \[1\] of 2 have no device"):
        slice_table([(0, 0, 2)], 2)
    with pytest.raises(LayoutError, match="for 2 processes, and this run has 4"):
        shard_of((0, 1), 0, 4)


# -- on one real process ----------------------------------------------------------------

jax = pytest.importorskip("jax")
aj = pytest.importorskip("aioloader.jax")
NamedSharding = jax.sharding.NamedSharding
P = jax.sharding.PartitionSpec


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("slices"), n=40, shards=2)


def _ids(data, **shard):
    return (al.Dataset.from_arrayrecord(data).shuffle(1).shard_by_jax_process(**shard)
            .map(fns.decode).map(fns.only_id_noise_det).batch(4, drop_remainder=True))


def test_one_process_is_one_slice_whatever_the_sharding(data):
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    for spec in (P("data"), P(("data",), None), P(), P(("data", "model"))):
        assert aj.data_slice(NamedSharding(mesh, spec)) == (0, 1)
    want = [fns.ids_of(b) for b in _ids(data).loader(workers=0)]
    rows = NamedSharding(mesh, P("data"))
    given_here = _ids(data, sharding=rows).loader(workers=0)
    assert [fns.ids_of(b) for b in given_here] == want
    assert [np.asarray(b["id"]).tolist() for b in _ids(data).loader().to_jax(rows)] == want


def test_several_processes_without_a_sharding_refuse_before_the_first_batch(
        data, monkeypatch):
    """The loader cannot know which processes share rows: it says how to tell it, and a
    state given meanwhile waits for the shard that to_jax's sharding gives."""
    monkeypatch.setattr(aj, "process_shard", lambda ds: (1, 2))  # process 1 of 2 slices
    whole = [fns.ids_of(b) for b in _ids(data).loader(workers=0)]
    loader = _ids(data).loader(workers=0)
    batches = iter(loader)
    next(batches)
    state = loader.get_state()
    loader.close()
    monkeypatch.undo()

    monkeypatch.setattr(aj, "process_index_and_count", lambda: (1, 2))
    loader = _ids(data).loader(workers=0)
    with pytest.raises(ValueError, match=r"on 2 JAX processes needs the batch's sharding"):
        next(iter(loader))
    with pytest.raises(ValueError, match=r"to_jax\(sharding\)"):
        al.Dataset.from_arrayrecord(data).shard_by_jax_process()[0]
    loader = _ids(data).loader(workers=0, state=state)
    assert loader.get_state() == state  # kept, not checked against an unknown shard
    loader.start_prefetch()  # waits for the shard
    loader.use_data_slice((1, 2))  # what to_jax(sharding) does
    assert not loader.closed
    assert loader.process_count == 2 and loader.get_state() == state
    assert [fns.ids_of(b) for b in loader] == whole[1:]


def test_orbax_merges_one_state_per_data_slice(data, tmp_path, monkeypatch):
    """Processes of one data slice save the same state; restored on another process count
    the handler merges one per slice, and every kept record comes out once."""
    pytest.importorskip("orbax.checkpoint")
    from etils import epath

    from aioloader.jax import LoaderCheckpointHandler, LoaderRestore, LoaderSave

    def evens(slices):
        return (al.Dataset.from_arrayrecord(data).shuffle(2)
                .shard_by_jax_process(drop_remainder=False).map(fns.decode)
                .filter(fns.keep_even).map(fns.just_id).batch(4 // slices))

    handler, where, seen = LoaderCheckpointHandler(), epath.Path(tmp_path), []
    for i in range(4):  # replicas {0, 1} and {2, 3}: 2 data slices
        monkeypatch.setattr(aj, "process_index_and_count", lambda i=i: (i, 4))
        monkeypatch.setattr(aj, "process_shard", lambda ds, i=i: (i // 2, 2))
        loader = evens(2).loader(workers=0)
        got = [x for _, b in zip(range(2 + i // 2), loader) for x in b.tolist()]
        seen += got if i % 2 == 0 else []  # a replica's rows count once
        handler.save(where, LoaderSave(loader))
        loader.close()
    monkeypatch.undo()
    monkeypatch.setattr(aj, "process_index_and_count", lambda: (0, 1))
    loader = evens(1).loader(workers=0)
    handler.restore(where, LoaderRestore(loader))
    rest = [x for b in loader for x in b.tolist()]
    assert seen and rest and sorted(seen + rest) == list(range(0, 40, 2))


def test_orbax_restore_follows_the_new_slice_layout_on_the_same_process_count(
        data, tmp_path, monkeypatch):
    """Saved with slices (0, 0, 1, 1), restored on the same 4 processes laid out (0, 1, 0, 1):
    each process resumes its new slice's position, so replicas load the same rows (reading
    its own old file, process 1 resumed old slice 0 as slice 1, and its replica 3 old
    slice 1)."""
    pytest.importorskip("orbax.checkpoint")
    from etils import epath

    from aioloader.jax import LoaderCheckpointHandler, LoaderRestore, LoaderSave

    def evens():
        return (al.Dataset.from_arrayrecord(data).shuffle(2)
                .shard_by_jax_process(drop_remainder=False).map(fns.decode)
                .filter(fns.keep_even).map(fns.just_id).batch(2))

    handler, where = LoaderCheckpointHandler(), epath.Path(tmp_path)
    old, new = (0, 0, 1, 1), (0, 1, 0, 1)
    for i in range(4):  # slice 0 one batch in, slice 1 three
        monkeypatch.setattr(aj, "process_index_and_count", lambda i=i: (i, 4))
        monkeypatch.setattr(aj, "process_shard", lambda ds, i=i: (old[i], 2))
        loader = evens().loader(workers=0)
        for _ in zip(range(1 + 2 * old[i]), loader):
            pass
        handler.save(where, LoaderSave(loader))
        loader.close()
    firsts = {}
    for i in range(4):
        monkeypatch.setattr(aj, "process_index_and_count", lambda i=i: (i, 4))
        monkeypatch.setattr(aj, "process_shard", lambda ds, i=i: (new[i], 2))
        loader = evens().loader(workers=0)
        handler.restore(where, LoaderRestore(loader))
        firsts[i] = next(iter(loader)).tolist()
        loader.close()
    assert firsts[0] == firsts[2] and firsts[1] == firsts[3], firsts
    assert firsts[0] != firsts[1], firsts
