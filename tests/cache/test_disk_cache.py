"""The disk tier (aioloader.cache): segments of remote files kept in a local directory.

Entries that are damaged, truncated, foreign or half written are dropped and fetched again,
never returned; processes sharing a directory download each segment once; a restarted
loader reads its epoch from disk; every record equals the local file's (and array_record's).
Reads go to the emulator over real HTTP through the delay line, which counts them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import aioloader as al
from aioloader.cache.disk import PAYLOAD_AT, DiskCache, SegmentKey, entry_size
from aioloader.cache.tier import DiskTier
from aioloader.io.storage import Storage
from aioloader.testing import local_gcs
from aioloader.workers.decode import Decoder

from ..runtime.test_pipeline import _write
from ..support import disk_cache_child as child
from ..support import pipeline_fns as fns
from ..support.arrayrecord_util import read_theirs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 1500
SEGMENT = 16 << 10  # memory_budget / 4 in the loader: many segments
SECRET = "sig-Zm9vYmFy"


# -- the store alone ------------------------------------------------------------------

def _key(i=0, n=1000):
    return SegmentKey(f"gs://b/f.array_record?X-Goog-Signature={SECRET}", "17", i * n,
                      (i + 1) * n)


def _payload(i=0, n=1000):
    return bytes((i * 7 + j) % 251 for j in range(n))


@pytest.fixture
def cache(tmp_path):
    c = DiskCache(tmp_path / "cache", 1 << 20)
    yield c
    c.close()


def test_an_entry_reads_back_and_its_name_holds_no_url(cache, caplog):
    key = _key()
    assert cache.write(key, _payload())
    assert cache.verify(key) is not None
    assert cache.read(key, None, [(10, 20), (0, 1000)]) == [_payload()[10:20], _payload()]
    names = os.listdir(cache.directory)
    assert names == [cache.name(key)]
    assert SECRET not in cache.path(key) and "f.array_record" not in cache.path(key)
    with open(cache.path(key), "rb") as f:
        assert SECRET.encode() not in f.read()


def _damage(path, how):
    data = Path(path).read_bytes()
    if how == "flipped":
        data = data[:PAYLOAD_AT + 5] + bytes([data[PAYLOAD_AT + 5] ^ 1]) + data[PAYLOAD_AT + 6:]
    elif how == "truncated":
        data = data[:-7]
    elif how == "half written":  # a foreign, non-atomic writer caught midway
        data = data[: len(data) // 2] + bytes(len(data) - len(data) // 2)
    elif how == "empty":
        data = b""
    Path(path).write_bytes(data)


@pytest.mark.parametrize("how", ["flipped", "truncated", "half written", "empty", "foreign",
                                 "symlink"])
def test_a_bad_entry_is_dropped_never_returned(cache, caplog, how):
    key, other = _key(0), _key(1)
    assert cache.write(key, _payload(0)) and cache.write(other, _payload(1))
    path = cache.path(key)
    if how == "foreign":  # another segment's entry under this name
        os.replace(cache.path(other), path)
    elif how == "symlink":
        os.unlink(path)
        os.symlink(cache.path(other), path)
    else:
        _damage(path, how)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        assert cache.verify(key) is None
        assert cache.read(key, None, [(0, 10)]) is None
    assert not os.path.lexists(path)  # dropped: the next use fetches it again
    assert "dropped" in caplog.text and SECRET not in caplog.text
    assert cache.write(key, _payload(0)) and cache.verify(key) is not None


def test_an_entry_rewritten_under_a_reader_is_checked_again(cache):
    key = _key()
    cache.write(key, _payload())
    known = cache.verify(key)
    _damage(cache.path(key), "flipped")  # same inode, edited in place: not re-checked...
    os.replace(cache.path(key), cache.path(key) + ".x")  # ...but a new file at the name is
    Path(cache.path(key)).write_bytes(Path(cache.path(key) + ".x").read_bytes())
    assert cache.read(key, known, [(0, 10)]) is None


def test_concurrent_writes_never_exceed_the_budget(tmp_path):
    """The disk threads write at once: room is taken when checked, so 16 writers racing for
    3 entries' room store 3 (all fresh: none evicted), never more."""
    from concurrent.futures import ThreadPoolExecutor

    n = 200_000  # a write long enough for the others to check the room meanwhile
    c = DiskCache(tmp_path / "c", 3 * entry_size(n))
    with ThreadPoolExecutor(16) as pool:
        stored = list(pool.map(lambda i: c.write(_key(i, n), _payload(i % 3, n)), range(16)))
    assert sum(stored) == 3
    on_disk = sum(os.path.getsize(p) for p in (tmp_path / "c").iterdir())
    assert on_disk <= c.max_bytes


def test_the_budget_evicts_least_recently_used_and_refuses_when_all_are_fresh(tmp_path):
    n = 1000
    c = DiskCache(tmp_path / "c", 3 * entry_size(n))
    keys = [_key(i, n) for i in range(5)]
    for i, k in enumerate(keys[:3]):
        assert c.write(k, _payload(i, n))
        os.utime(c.path(k), (1000 + i, 1000 + i))  # used long ago, k0 the longest
    os.utime(c.path(keys[0]), (5000, 5000))  # k0 used since: k1 goes first
    assert c.write(keys[3], _payload(3, n))
    assert not os.path.exists(c.path(keys[1])) and os.path.exists(c.path(keys[0]))
    assert c.usage() <= c.max_bytes
    # Entries used within the grace period are never evicted: the new one is refused.
    for k in keys:
        if os.path.exists(c.path(k)):
            os.utime(c.path(k))
    assert not c.write(keys[4], _payload(4, n))
    assert c.usage() <= c.max_bytes and c.refused == 1
    c.close()


def test_other_files_in_the_directory_are_left_alone(tmp_path):
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    mine = d / "notes.txt"
    mine.write_bytes(b"x" * 5000)
    os.utime(mine, (1, 1))
    c = DiskCache(d, 2 * entry_size(1000))
    for i in range(4):
        c.write(_key(i), _payload(i))
        os.utime(c.path(_key(i)), (100 + i, 100 + i))
    assert mine.read_bytes() == b"x" * 5000
    c.close()


def test_a_cache_dir_that_is_a_file_or_shared_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"keep me")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        DiskCache(f, 1 << 20)
    assert f.read_bytes() == b"keep me"
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(PermissionError, match="chmod go-w"):
        DiskCache(d, 1 << 20)


def test_a_dead_lock_holder_blocks_no_one(cache):
    key = _key()
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600);"
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")
    lock_path = os.path.join(cache.directory, "." + cache.name(key) + ".lock")
    p = subprocess.Popen([sys.executable, "-c", code, lock_path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert cache.try_lock(key) is None  # held by a live process
    finally:
        p.kill()
        p.wait()
    lock = cache.try_lock(key)  # the kernel dropped the dead one's lock
    assert lock is not None
    assert cache.try_lock(key) is None
    lock.release()
    assert not os.path.exists(lock_path)


# -- with the bucket ------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("disk"), n=N, shards=4)


@pytest.fixture(scope="module")
def bucket(data):
    with local_gcs(proxy=True) as gcs:
        urls = [gcs.upload(p, f"d/{os.path.basename(p)}") for p in data]
        yield gcs, urls


def pipeline(paths, **kw):
    return (al.Dataset.from_arrayrecord(paths, **kw).shuffle(3).map(fns.decode)
            .random_map(fns.augment).map(fns.only_id_noise).batch(64))


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


async def _run(ds, wait_filled=False, **kw):
    async with ds.loader(memory_budget=4 * SEGMENT, resident_bytes=0, **kw) as it:
        batches = [b async for b in it]
        for _ in range(3000):
            cache = it.stats().as_dict()["cache"]
            if not wait_filled or cache["disk_filled"]:
                break
            await asyncio.sleep(0.01)
        return batches, cache


def _open_cost(gcs, urls, budget=4 * SEGMENT):
    """The GETs opening the files costs (tail reads within the loader's byte budget)."""
    n0 = gcs.proxy_stats.downloads
    storage = Storage(max_inflight_bytes=budget, storage_options=gcs.storage_options)
    with al.ArrayRecordSource(urls, storage=storage) as src:
        len(src)
        src._sync(storage.aclose())
    return gcs.proxy_stats.downloads - n0


def _child(what, **args):
    out = subprocess.run([sys.executable, "-m", "tests.support.disk_cache_child", what,
                          json.dumps(args)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("workers", [0, 1])
async def test_records_equal_local_reads_while_the_cache_fills(data, bucket, tmp_path,
                                                               workers):
    gcs, urls = bucket
    ref, _ = await _run(pipeline(data), workers=0)
    remote = pipeline(urls, storage_options=gcs.storage_options)
    first, st = await _run(remote, wait_filled=True, workers=workers,
                           cache_dir=tmp_path / "c")
    _same(first, ref)
    assert st["disk_filled"] and st["disk_segments"] == st["disk_total_segments"] > 10
    n0 = gcs.proxy_stats.downloads
    second, st2 = await _run(remote, workers=workers, cache_dir=tmp_path / "c")
    _same(second, ref)
    assert st2["disk_records_remote"] == 0 and st2["disk_downloads"] == 0
    assert gcs.proxy_stats.downloads - n0 == _open_cost(gcs, urls)  # opening, nothing more


@pytest.mark.parametrize("group", [1, 8])
def test_records_from_disk_equal_array_records_reads(bucket, tmp_path, group):
    gcs, _ = bucket
    data = _write(tmp_path, n=1000, shards=2, group=group)
    urls = [gcs.upload(p, f"g{group}/{os.path.basename(p)}") for p in data]
    with al.ArrayRecordSource(urls, storage_options=gcs.storage_options) as src:
        table = src.table

        async def from_disk():
            tier = DiskTier(DiskCache(tmp_path / "c", 1 << 30), table, src.storage, 4096)
            tier.start_filler(4, now=True)
            while not tier.filled:
                await asyncio.sleep(0.01)
            order = np.random.default_rng(0).permutation(len(table))
            refs = table.chunk_refs(order)
            local = await tier.local_refs(refs)
            await tier.aclose()
            return order, local, len(tier)

        order, local, segments = src._sync(from_disk())
    assert local is not None and segments > 4
    decoder = Decoder()
    try:  # what a worker does with the redirected refs
        got = decoder.records(local, None)
    finally:
        decoder.files.close()
    theirs = [r for p in data for r in read_theirs(p)]
    assert got == [theirs[i] for i in order.tolist()]


def test_two_processes_download_each_segment_once(data, bucket, tmp_path):
    gcs, urls = bucket
    args = dict(urls=urls, opts=gcs.storage_options, cache_dir=str(tmp_path / "c"),
                segment=SEGMENT, start_at=time.time() + 3)
    n0 = gcs.proxy_stats.downloads
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.disk_cache_child", "fill",
                               json.dumps(args)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT}) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    segments = outs[0]["segments"]
    assert all(o["on_disk"] == segments for o in outs)
    assert sum(o["downloads"] for o in outs) == segments  # each once, between them
    opening = _open_cost(gcs, urls, 256 << 20)  # the children's sources' default budget
    assert gcs.proxy_stats.downloads - n0 - opening == segments + 2 * opening


async def test_a_restarted_loader_reads_its_epoch_from_disk(data, bucket, tmp_path):
    gcs, urls = bucket
    cache_dir = str(tmp_path / "c")
    first, _ = await _run(child.pipeline(urls, gcs.storage_options), wait_filled=True,
                          workers=1, cache_dir=cache_dir)
    ids = [int(i) for b in first for i in b]
    assert sorted(ids) == list(range(N))
    n0 = gcs.proxy_stats.downloads
    again = _child("load", urls=urls, opts=gcs.storage_options, cache_dir=cache_dir,
                   segment=SEGMENT)  # a new process: nothing in memory
    assert again["ids"] == ids
    assert again["cache"]["disk_records_remote"] == 0
    n1 = gcs.proxy_stats.downloads
    assert n1 - n0 == _open_cost(gcs, urls)  # opening the files, nothing more


async def test_damaged_entries_are_fetched_again(data, bucket, tmp_path, caplog):
    gcs, urls = bucket
    ref, _ = await _run(pipeline(data), workers=0)
    remote = pipeline(urls, storage_options=gcs.storage_options)
    cache_dir = tmp_path / "c"
    await _run(remote, wait_filled=True, cache_dir=cache_dir)
    entries = sorted(p for p in os.listdir(cache_dir) if p.endswith(".seg"))
    _damage(os.path.join(cache_dir, entries[0]), "flipped")
    _damage(os.path.join(cache_dir, entries[1]), "truncated")
    os.replace(os.path.join(cache_dir, entries[3]), os.path.join(cache_dir, entries[2]))
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        again, st = await _run(remote, wait_filled=True, workers=1, cache_dir=cache_dir)
    _same(again, ref)
    assert caplog.text.count("dropped") >= 3 and st["disk_dropped"] >= 3
    assert st["disk_downloads"] == 4  # the three, and the one moved away
    assert st["disk_segments"] == st["disk_total_segments"]


async def test_cache_bytes_is_respected(data, bucket, tmp_path):
    gcs, urls = bucket
    ref, _ = await _run(pipeline(data), workers=0)
    remote = pipeline(urls, storage_options=gcs.storage_options)
    budget = 5 * entry_size(SEGMENT)
    cache_dir = tmp_path / "c"
    got, st = await _run(remote, wait_filled=True, cache_dir=cache_dir, cache_bytes=budget)
    _same(got, ref)
    used = sum(os.path.getsize(os.path.join(cache_dir, p)) for p in os.listdir(cache_dir))
    assert 0 < used <= budget
    assert 0 < st["disk_segments"] < st["disk_total_segments"]


def test_cache_options_are_checked(tmp_path):
    with pytest.raises(TypeError, match="cache_dir"):
        al.ReadOptions(cache_dir=3)
    with pytest.raises(ValueError, match="cache_bytes"):
        al.ReadOptions(cache_bytes=-1)
    assert al.ReadOptions(cache_dir=tmp_path).cache_dir == str(tmp_path)
