"""A cancelled or timed-out `__anext__` loses nothing: the batch it was waiting for is the
next one handed over, and the stream goes on to its true end."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aioloader as al
from tests.support import pipeline_fns as fns
from tests.workers.test_executors import N, _write


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("cancelled"), n=N, shards=3, group=8)


def _dataset(paths) -> al.Dataset:
    return (al.Dataset.from_arrayrecord(paths).shuffle(3).map(fns.decode)
            .map(fns.just_id).batch(8).map(fns.slow_batch))


async def _all(ds, *, tries: int, **kw) -> tuple[list, int]:
    got, gave_up = [], 0
    async with ds.loader(prefetch=2, **kw) as it:
        got.append(await it.__anext__())
        for _ in range(tries):  # most give up long before the next batch is made
            try:
                got.append(await asyncio.wait_for(it.__anext__(), 0.0001))
            except asyncio.TimeoutError:
                gave_up += 1
        async for b in it:
            got.append(b)
    return got, gave_up


@pytest.mark.parametrize("kw", [{"workers": 0}, {"workers": 2}])
def test_a_timed_out_next_loses_no_batch(paths, kw):
    ds = _dataset(paths)
    want, _ = asyncio.run(_all(ds, tries=0, workers=0))
    got, gave_up = asyncio.run(_all(ds, tries=20, **kw))
    assert gave_up > 0  # (else this run did not test what it is for)
    assert len(got) == len(want) == N // 8
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
