"""From a bucket the first task runs alone, then the prefetch depth opens
(`runtime.output.Run`): its reads do not share this process's CPU and connections with the
next tasks' hundreds of GETs, which made the first batch of 20 record-by-record shards wait
~14 round trips instead of ~10 (benchmarks/first_batch_rtt.py). Local files keep their
depth from the start (workers read them, in parallel)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

import aioloader as al
from aioloader.runtime.tasks import TaskRunner
from aioloader.testing import local_gcs

from ..runtime.test_pipeline import _write
from ..support.pipeline_fns import decode, just_id


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("first"), n=600, shards=2)


@pytest.fixture
def spans(monkeypatch):
    """(task, start, end) of every task the runner runs (the real method, timed)."""
    seen: list[tuple[int, float, float]] = []
    run = TaskRunner.run

    async def timed(self, k, lo, hi):
        t0 = time.perf_counter()
        try:
            return await run(self, k, lo, hi)
        finally:
            seen.append((k, t0, time.perf_counter()))

    monkeypatch.setattr(TaskRunner, "run", timed)
    return seen


def _take(ds: al.Dataset, n: int, **kw) -> list[list[int]]:
    with ds.loader(workers=0, prefetch=4, **kw) as it:
        out = []
        for batch in it:
            out.append(np.asarray(batch).tolist())
            if len(out) == n:
                return out
    return out


def _first_alone(seen) -> bool:
    by = {k: (a, b) for k, a, b in seen}
    return all(a >= by[0][1] for k, (a, _) in by.items() if k)


def test_from_a_bucket_the_first_task_runs_alone_then_the_depth_opens(paths, spans):
    pipeline = lambda src, **o: (al.Dataset.from_arrayrecord(src, **o)  # noqa: E731
                                 .shuffle(3).map(decode).map(just_id).batch(32))
    local = _take(pipeline(paths), 8)
    local_spans = list(spans)
    spans.clear()
    with local_gcs(latency_ms=20) as gcs:
        urls = [gcs.upload(p, f"first/{p.rsplit('/', 1)[-1]}") for p in paths]
        remote = _take(pipeline(urls, storage_options=gcs.storage_options), 8,
                       resident_bytes=0)
    assert remote == local  # the same batches, in the same order
    assert _first_alone(spans), sorted(spans)
    # then several at once: some task started before the one before it ended
    later = sorted(s for s in spans if s[0])
    assert any(b[1] < a[2] for a, b in itertools.pairwise(later)), later
    assert not _first_alone(local_spans), sorted(local_spans)  # local: depth from the start
