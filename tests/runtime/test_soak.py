"""Soak: a 1M-record run under a memory budget keeps a flat RSS (slow tier: make test-slow)."""

from __future__ import annotations

import os

import psutil
import pytest

import aioloader as al

from ..support import pipeline_fns as fns

N = 1_000_000
SHARDS = 8


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    root = tmp_path_factory.mktemp("soak")
    paths = [str(root / f"m-{k:05d}-of-{SHARDS:05d}.ar") for k in range(SHARDS)]
    writers = [al.ArrayRecordWriter(p) for p in paths]
    for i in range(N):
        writers[i % SHARDS].write(b'{"id": %d, "tokens": [1, 2, 3]}' % i)
    for w in writers:
        w.close()
    return paths


@pytest.mark.slow
def test_rss_stays_flat_over_a_million_records(million):
    me = psutil.Process(os.getpid())
    ds = (al.Dataset.from_arrayrecord(million).shuffle(1).map(fns.decode)
          .map(fns.only_id_noise_det).batch(512))
    samples = []
    seen = 0
    with ds.loader(workers=2, prefetch=8, memory_budget=64 << 20) as it:
        for k, batch in enumerate(it):
            seen += len(batch["id"])
            if k % 50 == 0:
                rss = me.memory_info().rss + sum(c.memory_info().rss
                                                 for c in me.children(recursive=True))
                samples.append(rss)
    assert seen == N
    warm = samples[len(samples) // 5]  # after start-up and the first allocations
    growth = max(samples[len(samples) // 5 :]) - warm
    print(f"RSS after warm-up {warm / 2**20:.0f} MiB, growth {growth / 2**20:.1f} MiB")
    assert growth < 64 << 20, f"RSS grew {growth / 2**20:.1f} MiB over the run"
