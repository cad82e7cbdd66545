"""Stream mode end to end (filter or pack before the batching): the same outputs and states
whatever the worker count and however many windows a task holds, and exact resume, also
when a state saved with another window is set on a running loader."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support import state_fixture as fx


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    return fx.pipelines(fx.write_files(tmp_path_factory.mktemp("stream")))


def outputs(ds, **kw):
    """(digest, state) of every output."""
    it = ds.loader(**kw)
    try:
        return [(fx.digest(b), it.get_state()) for b in it]
    finally:
        it.close()


STREAM = ["filter_batch", "pack_batch", "filter_elements"]


@pytest.mark.parametrize("name", STREAM)
def test_outputs_and_states_do_not_depend_on_workers(pipelines, name):
    ref = outputs(pipelines[name], workers=0)
    assert len(ref) > 10
    assert outputs(pipelines[name], workers=2) == ref


@pytest.mark.parametrize("name", STREAM)
@pytest.mark.parametrize("window", [1, 3, 64])
def test_outputs_do_not_depend_on_the_window_and_each_state_resumes(pipelines, name, window):
    ds = pipelines[name]
    ref = [d for d, _ in outputs(ds)]
    got = outputs(ds, window=window, workers=1)
    assert [d for d, _ in got] == ref
    assert all(s["unit"] == window for _, s in got)
    for k in (0, len(got) // 3, len(got) - 2):
        state = json.loads(json.dumps(got[k][1]))
        assert [d for d, _ in outputs(ds, state=state)] == ref[k + 1 :]


def _after_set_state(ds, state):
    """(digest, state) of the outputs of a running loader (window 64) after `state`."""

    async def rest():
        async with ds.loader(window=64, workers=1) as it:
            await it.__anext__()
            it.set_state(state)
            return [(fx.digest(b), it.get_state()) async for b in it]

    return asyncio.run(rest())


@pytest.mark.parametrize("name", STREAM)
def test_a_state_with_another_window_set_on_a_running_loader(pipelines, name):
    ds = pipelines[name]
    ref = outputs(ds, window=5)
    k = len(ref) // 2
    got = _after_set_state(ds, ref[k][1])  # saved with window 5
    assert [d for d, _ in got] == [d for d, _ in ref[k + 1 :]]


@pytest.mark.parametrize("name", STREAM)
def test_states_after_setting_one_with_another_window_resume(pipelines, name):
    ds = pipelines[name]
    ref = outputs(ds, window=5)
    got = _after_set_state(ds, ref[len(ref) // 2][1])
    k = len(got) // 2
    state = json.loads(json.dumps(got[k][1]))
    assert [d for d, _ in outputs(ds, state=state)] == [d for d, _ in got[k + 1 :]]
