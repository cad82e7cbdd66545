"""The same batches whatever runs them: inline (workers=0), processes and threads give the
same bytes for every kind of pipeline (shuffle, map, random_map, filter, flat_map, pack, padded
batches, buckets by length), locally and from a bucket; a state saved under one
executor resumes under another bit for bit; a transform's error is the same error; closing
threads stuck in a transform returns after the grace, says so, and leaves no other thread."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time

import pytest

import aioloader as al
from aioloader.errors import TransformError
from aioloader.testing import local_gcs
from aioloader.workers import CLOSE_GRACE_S
from aioloader.workers.kinds import kind_named
from aioloader.workers.threads import THREADS

from ..runtime.test_bucket_by_length import n_tokens
from ..runtime.test_pipeline import _write
from ..support import pipeline_fns as fns
from ..support.state_fixture import digest

N = 240
RUNS = [{"workers": 0}, {"workers": 2, "executor": "processes"},
        {"workers": 1, "executor": "threads"}, {"workers": 2, "executor": "threads"},
        {"workers": "auto", "executor": "threads"}]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Records in chunks of 8 (decoded chunks are cached per decoding thread or process)."""
    return _write(tmp_path_factory.mktemp("executors"), n=N, shards=3, group=8)


def pipelines(paths, **kw) -> dict[str, al.Dataset]:
    ds = al.Dataset.from_arrayrecord(paths, **kw)
    return {
        "map_random_map_batch": ds.shuffle(5).repeat(2).map(fns.decode)
                                  .random_map(fns.augment).map(fns.only_id_noise).batch(16),
        "filter": ds.shuffle(3).map(fns.decode).filter(fns.keep_even).map(fns.id_and_text)
                    .batch(8),
        "flat_map": ds.shuffle(13).map(fns.decode).flat_map(fns.split_tokens)
                      .filter(fns.not_k2).random_map(fns.augment).map(fns.id_k_noise).batch(8),
        "pack": ds.shuffle(4).map(fns.decode).map(fns.only_tokens)
                  .pack({"tokens": 50}, num_packing_bins=3).batch(4),
        "pad": ds.shuffle(6).map(fns.decode).filter(fns.keep_even).random_map(fns.augment)
                 .batch(8, pad=True),
        "bucket": ds.shuffle(7).repeat(2).map(fns.decode).map(fns.only_tokens)
                    .bucket_by_length(n_tokens, [8, 20], [4, 3, 2]),
    }


def sha256(batches) -> str:
    return hashlib.sha256("".join(map(digest, batches)).encode()).hexdigest()


def run(ds, state=None, **kw) -> list:
    with ds.loader(state=state, prefetch=2, **kw) as it:
        return list(it)


@pytest.mark.parametrize("name", ["map_random_map_batch", "filter", "flat_map", "pack", "pad",
                                  "bucket"])
def test_every_executor_gives_the_same_bytes(paths, name):
    ds = pipelines(paths)[name]
    got = {json.dumps(kw): sha256(run(ds, **kw)) for kw in RUNS}
    assert len(set(got.values())) == 1, got


def test_from_a_bucket_every_executor_gives_the_same_bytes(paths):
    expected = sha256(run(pipelines(paths)["map_random_map_batch"], workers=0))
    with local_gcs() as gcs:
        urls = [gcs.upload(p, f"ex/{p.rsplit('/', 1)[1]}") for p in paths]
        ds = pipelines(urls, storage_options=gcs.storage_options)["map_random_map_batch"]
        for kw in RUNS[1:]:
            assert sha256(run(ds, **kw)) == expected, kw


@pytest.mark.parametrize("saved, resumed", [("processes", "threads"), ("threads", "processes")])
def test_a_state_saved_under_one_executor_resumes_under_another(paths, saved, resumed):
    for name, ds in pipelines(paths).items():
        full = run(ds, workers=0)
        it = ds.loader(workers=2, executor=saved, prefetch=2)
        head = []
        for batch in it:
            head.append(batch)
            if len(head) == 5:
                break
        state = json.loads(json.dumps(it.get_state()))
        it.close()
        rest = run(ds, state=state, workers=2, executor=resumed)
        assert sha256(head + rest) == sha256(full), name


def test_a_transform_error_is_the_same_whatever_runs_it(paths):
    ds = (al.Dataset.from_arrayrecord(paths).map(fns.decode).map(fns.fail_on_13)
          .map(fns.only_id_noise_det).batch(10))
    errors = set()
    for kw in RUNS:
        with pytest.raises(TransformError) as info:
            run(ds, **kw)
        errors.add(str(info.value))
    assert len(errors) == 1, errors
    assert "fail_on_13" in errors.pop()


def _aioloader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aioloader-thread")]


def test_threads_run_transforms_that_cannot_be_pickled_and_start_at_once(paths):
    lock = threading.Lock()  # a closure holding a lock: no worker process could have it

    def with_lock(element):
        with lock:
            return {"id": element["id"]}

    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).map(with_lock).batch(16)
    running, ids = [], []
    with ds.loader(workers=2, executor="threads") as it:
        for b in it:
            running = running or _aioloader_threads()
            ids += b["id"].tolist()
        stats = it.stats()
    assert len(running) == 2  # (and no worker process: nothing is pickled)
    assert sorted(ids) == list(range(N))
    assert stats.as_dict()["executor"] == "threads"
    assert "executor: threads, 2 workers" in str(stats)
    assert _aioloader_threads() == []  # closed: every thread ended


@pytest.mark.parametrize("kw, name", [({"workers": 0}, "inline"),
                                      ({"workers": 1}, "processes"),
                                      ({"workers": 1, "executor": "threads"}, "threads"),
                                      ({"workers": "auto", "executor": "threads"}, "threads")])
def test_stats_name_the_executor(paths, kw, name):
    ds = al.Dataset.from_arrayrecord(paths).map(fns.decode).map(fns.just_id).batch(40)
    with ds.loader(**kw) as it:
        list(it)
        assert it.stats().as_dict()["executor"] == name
        assert f"executor: {name}" in str(it.stats())


def test_the_threads_kind_is_looked_up_by_name():
    assert kind_named("threads") is THREADS and THREADS.name == "threads"


def test_close_leaves_a_thread_stuck_in_a_transform_after_the_grace_and_says_so(paths, caplog):
    fns.ENTERED.clear()
    fns.RELEASE.clear()
    ds = (al.Dataset.from_arrayrecord(paths).map(fns.decode).map(fns.stuck_on_0)
          .map(fns.only_id_noise_det).batch(8))
    it = ds.loader(workers=2, executor="threads", prefetch=2)
    it.start_prefetch()
    try:
        assert fns.ENTERED.wait(30)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="aioloader"):
            it.close()
        took = time.monotonic() - t0
        assert 0.75 * CLOSE_GRACE_S < took < 3 * CLOSE_GRACE_S, took
        stuck = [r.getMessage() for r in caplog.records if "left behind" in r.getMessage()]
        assert stuck and "task " in stuck[0] and "stuck_on_0" in stuck[0], stuck
        assert len(_aioloader_threads()) == 1  # the stuck one; the other ended
    finally:
        fns.RELEASE.set()
    deadline = time.monotonic() + 10
    while _aioloader_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _aioloader_threads() == []  # once its transform returns, it ends too


def test_each_thread_decodes_with_its_own_share_of_the_chunk_cache(paths):
    ds = al.Dataset.from_arrayrecord(paths).shuffle(2).map(fns.decode).map(fns.just_id).batch(8)
    with ds.loader(workers=2, executor="threads", prefetch=4) as it:
        batches = iter(it)
        ids = [i for _, b in zip(range(20), batches) for i in b.tolist()]
        pool = it.pool
        decoders = list(pool._decoders)
        shares = {d.cache.max_bytes for d in decoders}
        caches = [len(d.cache) for d in decoders]
    assert len(ids) == 160
    assert 1 <= len(decoders) <= 2 and len({id(d) for d in decoders}) == len(decoders)
    assert shares == {pool.pipeline.chunk_cache_bytes // 2}
    assert sum(caches) > 0  # chunks of 8 records, kept decoded by the thread that read them


@pytest.mark.parametrize("executor", ["processes", "ray"])
def test_a_transform_that_cannot_travel_is_refused_where_it_must_travel(paths, executor):
    lock = threading.Lock()

    def with_lock(element):
        with lock:
            return element

    ds = al.Dataset.from_arrayrecord(paths).map(with_lock).batch(16)
    with pytest.raises(TypeError, match=r"map\(.*with_lock\) cannot be pickled"):
        ds.loader(workers=1, executor=executor)  # before any worker or actor starts
