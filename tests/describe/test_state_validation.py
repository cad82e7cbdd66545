"""A saved loader state is checked whole before anything resumes (issue 13, item 18)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.describe.state import StateError, check_state

from ..runtime.test_pipeline import _write
from ..support import pipeline_fns as fns


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("state"), n=200, shards=2)


def _ds(data):
    return (al.Dataset.from_arrayrecord(data).shuffle(seed=1).map(fns.decode).map(fns.just_id)
            .batch(32))


def _state(data, **change):
    with _ds(data).loader() as it:
        batches = iter(it)
        next(batches)
        state = json.loads(json.dumps(it.get_state()))
    state.update(change)
    return state


@pytest.mark.parametrize("change, message", [
    ({"position": 2**70}, r"'position' = \d+ is outside \[0, 2\*\*62\)"),
    ({"position": -32}, r"'position' = -32 is outside"),
    ({"position": 32.0}, r"'position' must be an integer, got 32.0 \(float\)"),
    ({"position": "32"}, r"'position' must be an integer"),
    ({"position": True}, r"'position' must be an integer"),
    ({"position": None}, r"has no 'position'"),
    ({"skip": -1}, r"'skip' = -1"),
    ({"unit": 0}, r"'unit' = 0 is outside \[1,"),
    ({"process_count": 0}, r"'process_count' = 0"),
    ({"pipeline": None}, r"has no 'pipeline'"),
    ({"pipeline": "source -> batch(32)"}, r"has no 'pipeline'"),
    ({"version": 99}, r"version 99 is not 1"),
])
def test_a_malformed_state_is_refused_on_loader_and_set_state(data, change, message):
    bad = _state(data, **change)
    with pytest.raises(StateError, match=message):
        _ds(data).loader(state=bad)
    loader = _ds(data).loader()
    with pytest.raises(StateError, match=message):
        loader.set_state(bad)
    loader.close()


def test_a_state_that_is_not_a_dict_is_refused(data):
    with pytest.raises(StateError, match=r"the dict get_state\(\) returned, not list"):
        _ds(data).loader(state=[0, 32])


def test_a_position_off_the_batch_boundary_is_refused_before_any_batch(data):
    bad = _state(data, position=33)
    with pytest.raises(StateError, match=r"position 33 is not on a batch boundary"), \
            _ds(data).loader(state=bad) as it:
        list(it)


def test_a_position_past_the_end_is_refused(data):
    bad = _state(data, position=320)
    with pytest.raises(StateError, match=r"position 320 is past the end .*200 positions"), \
            _ds(data).loader(state=bad) as it:
        list(it)


def test_set_state_on_a_running_loader_checks_the_position(data):
    with _ds(data).loader() as it:
        batches = iter(it)
        next(batches)
        with pytest.raises(StateError, match=r"position 40 is not on a batch boundary"):
            it.set_state(_state(data, position=40))
        assert len(list(batches)) == 6  # a refused state changes nothing


def test_the_end_of_a_finite_stream_resumes_to_nothing(data):
    assert list(_ds(data).loader(state=_state(data, position=200))) == []


@given(st.integers(0, 2**62 - 1).map(lambda k: k // 32 * 32))
def test_every_boundary_position_passes_the_field_checks(position):
    state = {"version": 1, "position": position, "skip": 0, "rows": 0, "unit": 32,
             "process_count": 1, "pipeline": ["x"]}
    assert check_state(state)["position"] == position


def test_the_state_after_a_last_partial_batch_resumes_to_nothing(data):
    with _ds(data).loader() as it:
        assert len(list(it)) == 7  # 200 records: 6 batches of 32 and one of 8
        state = it.get_state()
    assert list(_ds(data).loader(state=state)) == []
