"""Elastic resume of stream-mode pipelines (filter, flat_map, pack): states saved by N
processes, merged, resume on M with every input record consumed exactly once.

The process index and count come from JAX; here they are set per loader (the runs are in
this process, one after another), so many moves are cheap to check. tests/devices/test_multihost.py
runs it with real JAX processes."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.errors import StateError
from aioloader.index import lanes
from aioloader.index.sampling import Shard
from tests.support import pipeline_fns as fns
from tests.support import state_fixture as fx

aj = pytest.importorskip("aioloader.jax")
GLOBAL = 12


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return fx.write_files(tmp_path_factory.mktemp("elastic"))


def pipeline(paths, name, count):
    ds = (al.Dataset.from_arrayrecord(paths).shuffle(3)
          .shard_by_jax_process(drop_remainder=False).map(fns.decode))
    if name == "filter_batch":
        return ds.filter(fns.keep_even).map(fns.just_id).batch(GLOBAL // count)
    if name == "filter_pack":
        return ds.filter(fns.keep_even).map(fns.id_tokens).pack(
            {"tokens": 8}, num_packing_bins=3).batch(2)
    if name == "flat_map_pack":
        return ds.flat_map(fns.split_tokens).map(fns.id_tokens).pack(
            {"tokens": 8}, num_packing_bins=3)
    return ds.filter(fns.keep_even).map(fns.just_id)  # elements


def ids(item, name):
    if "pack" in name:
        return fns.packed_ids(item)
    return np.asarray(item).reshape(-1).tolist()


def run(paths, name, index, count, state=None, stop=None, window=None, monkeypatch=None):
    """(record ids of the items, the state after them) of process `index` of `count`."""
    monkeypatch.setattr(aj, "process_shard", lambda ds: (index, count))
    kw = {"window": window} if window else {}
    it = pipeline(paths, name, count).loader(workers=0, state=state, **kw)
    got = []
    try:
        for item in (it if stop is None else itertools.islice(it, stop)):
            got += ids(item, name)
        return got, json.loads(json.dumps(it.get_state()))
    finally:
        it.close()


_ALL: dict = {}


def everything(paths, name, monkeypatch):
    """Each record id as often as a run on one process yields it."""
    if name not in _ALL:
        _ALL[name] = collections.Counter(run(paths, name, 0, 1, monkeypatch=monkeypatch)[0])
    return _ALL[name]


def moves(paths, name, counts, stops, window, monkeypatch):
    """Run on counts[0] processes (process i stops after stops[i] items), merge the states,
    move to counts[1], ... and run the last count to the end; every id yielded."""
    seen: collections.Counter = collections.Counter()
    state = None
    for g, n in enumerate(counts):
        last = g == len(counts) - 1
        states = []
        for i in range(n):
            got, s = run(paths, name, i, n, state=state, window=window if g == 0 else None,
                         stop=None if last else stops[(g + i) % len(stops)],
                         monkeypatch=monkeypatch)
            seen.update(got)
            states.append(s)
        state = al.merge_states(states)
    return seen


@pytest.mark.parametrize("name", ["filter_pack", "filter_batch", "flat_map_pack"])
@pytest.mark.parametrize("old,new", [(2, 3), (4, 2)])
def test_a_move_consumes_every_record_once(paths, name, old, new, monkeypatch):
    seen = moves(paths, name, [old, new], [3, 1, 4, 2], 16, monkeypatch)
    assert seen == everything(paths, name, monkeypatch)


@pytest.mark.parametrize("name", ["filter_pack", "filter_elements", "filter_batch",
                                  "flat_map_pack"])
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.sampled_from([1, 2, 3, 4]), min_size=2, max_size=3),
       stops=st.lists(st.integers(0, 12), min_size=1, max_size=4),
       window=st.sampled_from([1, 5, 64, 1024]))
def test_moves_at_any_points_consume_every_record_once(paths, name, counts, stops, window,
                                                       monkeypatch):
    if name == "filter_batch" and any(GLOBAL % n for n in counts):
        return
    seen = moves(paths, name, counts, stops, window, monkeypatch)
    assert seen == everything(paths, name, monkeypatch)


def test_a_moved_run_resumes_exactly_on_its_own_count(paths, monkeypatch):
    """A state saved during the catch-up of a moved run resumes it bit-for-bit."""
    name = "filter_pack"
    states = [run(paths, name, i, 2, stop=2 + i, window=4, monkeypatch=monkeypatch)[1]
              for i in range(2)]
    merged = al.merge_states(states)
    full, _ = run(paths, name, 1, 3, state=merged, monkeypatch=monkeypatch)
    head, mid = run(paths, name, 1, 3, state=merged, stop=3, monkeypatch=monkeypatch)
    assert "lane" in mid
    rest, _ = run(paths, name, 1, 3, state=mid, monkeypatch=monkeypatch)
    assert head + rest == full


def test_one_state_of_a_filtered_run_does_not_move_alone(paths, monkeypatch):
    _, state = run(paths, "filter_batch", 0, 2, stop=2, monkeypatch=monkeypatch)
    with pytest.raises(StateError, match="merge_states"):
        run(paths, "filter_batch", 0, 3, state=state, monkeypatch=monkeypatch)


def test_merge_states_refuses_states_of_other_runs(paths, monkeypatch):
    a = run(paths, "filter_pack", 0, 2, stop=1, monkeypatch=monkeypatch)[1]
    b = run(paths, "filter_pack", 1, 2, stop=1, window=8, monkeypatch=monkeypatch)[1]
    with pytest.raises(StateError, match="unit"):
        al.merge_states([a, b])
    with pytest.raises(StateError, match="every process"):
        al.merge_states([a])


def test_a_pack_state_without_until_does_not_move(paths, monkeypatch):
    states = [run(paths, "filter_pack", i, 2, stop=2, monkeypatch=monkeypatch)[1]
              for i in range(2)]
    for s in states:
        s.pop("until", None)
    with pytest.raises(StateError, match="where packing blocks end"):
        run(paths, "filter_pack", 0, 3, state=al.merge_states(states),
            monkeypatch=monkeypatch)


# -- the pure remap ----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(data=st.data(), old=st.integers(1, 5), new=st.integers(1, 5),
       block=st.sampled_from([1, 2, 3]), parent_len=st.integers(0, 200))
def test_remap_covers_every_position_once(data, old, new, block, parent_len):
    """Old lanes consumed local positions < position (their windows in progress restart
    in a leftover); the leftovers and the new lanes from the cut cover every other parent
    position exactly once, and the cut is past every old process's `until`."""
    shards = [Shard(p, old, block=block) for p in range(old)]
    progress = []
    for s in shards:
        n = s.length(parent_len)
        pos = data.draw(st.integers(0, n))
        until = data.draw(st.integers(pos, n + 8))
        progress.append(lanes.Progress(s, pos, 0, 0, until))
    consumed = [int(x) for p in progress for x in
                p.lane.parent(np.arange(p.position), np.zeros(p.position, np.int64),
                              parent_len)[0]]
    moved = [lanes.remap(progress, j, new, block, False, parent_len) for j in range(new)]
    for lane in moved:
        n = lane.length(parent_len)
        consumed += lane.parent(np.arange(n), np.zeros(n, np.int64), parent_len)[0].tolist()
        assert lanes.from_json(json.loads(json.dumps(lanes.to_json(lane)))) == lane
    assert sorted(consumed) == list(range(parent_len))
    for p in progress:
        assert lanes.local_at(p.lane, moved[0].cut) >= min(p.until, p.lane.length(parent_len))


def test_an_edited_lane_is_refused_with_a_clear_error(paths, monkeypatch):
    states = [run(paths, "filter_pack", i, 2, stop=2, monkeypatch=monkeypatch)[1]
              for i in range(2)]
    _, moved = run(paths, "filter_pack", 0, 3, state=al.merge_states(states), stop=1,
                   monkeypatch=monkeypatch)
    bad = json.loads(json.dumps(moved))
    bad["lane"]["segments"][0][2] = 10**9  # a leftover past the end of its lane
    with pytest.raises(StateError, match="past the end of its lane"):
        run(paths, "filter_pack", 0, 3, state=bad, monkeypatch=monkeypatch)
    with pytest.raises(StateError, match="not 1 of 3"):  # process 0's lane on process 1
        run(paths, "filter_pack", 1, 3, state=moved, monkeypatch=monkeypatch)
    bad["lane"] = {"segments": "x"}
    with pytest.raises(StateError, match="segments"):
        run(paths, "filter_pack", 0, 3, state=bad, monkeypatch=monkeypatch)


def test_set_state_moves_a_running_loader(paths, monkeypatch):
    """A merged state set on a running loader of another count: the same items as a
    loader started with it."""
    name = "filter_pack"
    states = [run(paths, name, i, 2, stop=2 + i, window=4, monkeypatch=monkeypatch)[1]
              for i in range(2)]
    merged = al.merge_states(states)
    want, _ = run(paths, name, 0, 3, state=merged, monkeypatch=monkeypatch)
    monkeypatch.setattr(aj, "process_shard", lambda ds: (0, 3))

    async def rest():
        async with pipeline(paths, name, 3).loader(workers=0, window=4) as it:
            await it.__anext__()
            it.set_state(merged)
            return [i async for item in it for i in ids(item, name)]

    assert asyncio.run(rest()) == want


def test_set_state_moves_a_running_loader_of_a_mix(paths, monkeypatch):
    """As above, over a mix: the moved lanes index the mix's stream, as when started with
    the state (the plan is compiled for the state, not patched)."""

    def mixed(count):
        parts = [al.Dataset.from_arrayrecord(p) for p in paths]
        return (al.Dataset.mix(parts, [2, 1]).shard_by_jax_process(drop_remainder=False)
                .map(fns.decode).filter(fns.keep_even).map(fns.just_id))

    def ids_of(index, count, state=None, stop=None):
        monkeypatch.setattr(aj, "process_shard", lambda ds: (index, count))
        it = mixed(count).loader(workers=0, window=4, state=state)
        try:
            got = [int(x) for x in (it if stop is None else itertools.islice(it, stop))]
            return got, json.loads(json.dumps(it.get_state()))
        finally:
            it.close()

    merged = al.merge_states([ids_of(i, 2, stop=3 + i)[1] for i in range(2)])
    want, _ = ids_of(0, 3, state=merged)
    monkeypatch.setattr(aj, "process_shard", lambda ds: (0, 3))

    async def rest():
        async with mixed(3).loader(workers=0, window=4) as it:
            await it.__anext__()
            it.set_state(merged)
            return [int(x) async for x in it]

    assert want and asyncio.run(rest()) == want
