"""`executor=`: a name or a kind object picks where the workers run; the batches do not change."""

from __future__ import annotations

import pytest

import aioloader as al
from aioloader.workers.kinds import kind_named
from aioloader.workers.pool import PROCESSES, Pool

from .test_worker_decode import _same, batched, collect, files  # noqa: F401


class CountingProcesses:
    """A kind of the user's own: processes, counting the executors it opened."""

    name = "counted processes"

    def __init__(self) -> None:
        self.opened: list[Pool] = []

    def open(self, pipeline, workers, *, slots, slot_size, lanes, first_in_parent):
        pool = PROCESSES.open(pipeline, workers, slots=slots, slot_size=slot_size,
                              lanes=lanes, first_in_parent=first_in_parent)
        self.opened.append(pool)
        return pool


def test_a_name_picks_its_kind_and_an_object_is_its_own_kind():
    assert kind_named("processes") is PROCESSES
    own = CountingProcesses()
    assert kind_named(own) is own


@pytest.mark.parametrize("bad", ["process", "Threads", ""])
def test_an_unknown_name_is_refused_naming_the_choices(tmp_path, bad):
    with pytest.raises(ValueError, match="executor must be one of 'processes', 'threads', "
                                         "'ray'"):
        al.Dataset.from_arrayrecord(str(tmp_path / "x.array_record")).loader(executor=bad)


def test_an_object_without_open_is_refused(tmp_path):
    with pytest.raises(TypeError, match="an object with an open"):
        al.Dataset.from_arrayrecord(str(tmp_path / "x.array_record")).loader(executor=object())


async def test_a_kind_object_runs_the_tasks_and_the_batches_are_the_same(files):  # noqa: F811
    ds = batched(files[8])
    own = CountingProcesses()
    expected = await collect(ds, workers=1)
    got = await collect(ds, workers=1, executor=own)
    assert len(own.opened) == 1
    assert own.opened[0].transfers["in_slot"] + own.opened[0].transfers["by_value"] > 0
    _same(got, expected)


async def test_workers_0_runs_in_this_process_whatever_kind_is_named(files):  # noqa: F811
    own = CountingProcesses()
    await collect(batched(files[1]), workers=0, executor=own)
    assert own.opened == []


class WithoutGrouping:
    """A kind whose executor predates `tasks_per_call` (every other member, delegated)."""

    name = "no grouping"

    def open(self, pipeline, workers, **kw):
        inner = PROCESSES.open(pipeline, workers, **kw)

        class Executor:
            def __getattr__(self, name):
                if name == "tasks_per_call":
                    raise AttributeError(name)
                return getattr(inner, name)

        return Executor()


async def test_an_executor_without_tasks_per_call_runs_one_task_a_call(files):  # noqa: F811
    ds = batched(files[8])
    _same(await collect(ds, workers=1, executor=WithoutGrouping()),
          await collect(ds, workers=1))


@pytest.mark.parametrize("bad", [{"tasks_per_call": 0}, {"tasks_per_call": 1.5},
                                 {"tasks_per_call": True}, {"max_reruns": -1},
                                 {"max_reruns": 0.5}])
def test_a_ray_kinds_counts_are_whole_numbers(bad):
    from aioloader.workers.ray import RayExecutor  # (imports no Ray until it opens)

    (name,) = bad
    with pytest.raises(ValueError, match=f"{name} must be an int"):
        RayExecutor(**bad)
