"""Stalls: a bucket that goes silent is found by its silence, quickly; one slow request is
hedged; a read that keeps receiving bytes is never killed; the deadline bounds every attempt.

Every stall is real: the delay line in front of fake-gcs-server holds a range GET's response
before its head or mid-body (``hold_*`` faults), and the reads go over real HTTP. Wall-time
bounds are generous (a loaded 2-core machine) yet each sits well below what the code before
stall detection took (a 30 s whole-request timeout that won over the deadline, no hedging).

Time is asserted only as a behaviour bound: a lower bound a deliberate delay guarantees, or
finishing well before a deliberately long stall or timeout configured in the same test
(what a broken read would wait out), with many times the expected time as slack. Counts
(requests, retries, hedges, held responses) say what happened; how fast it is on a quiet
machine is the benchmarks' business.
"""

from __future__ import annotations

import asyncio
import http.client
import math
import time
import urllib.parse

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.io.retry import _Median
from aioloader.io.storage import RetryPolicy, Storage, StoreUnavailableError
from aioloader.testing import local_gcs

from ..support import reliability_child as rc

BLOB = np.random.default_rng(0).integers(0, 256, 256 << 10, dtype=np.uint8).tobytes()
NO_HEDGE = RetryPolicy(hedge_after=None)


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True, seed=5) as g:
        g.upload_bytes(BLOB, "stalls/blob")
        yield g


@pytest.fixture(autouse=True)
def _no_faults(gcs):
    gcs.set_faults()
    yield
    gcs.set_faults()


async def _timed(coro, guard: float):
    """`await coro` and how long it took; the guard turns a hang into a quick failure."""
    t0 = time.monotonic()
    result = await asyncio.wait_for(coro, guard)
    return result, time.monotonic() - t0


def _ranges(k: int, size: int = 4096) -> list[tuple[int, int]]:
    return [(i * size, (i + 1) * size) for i in range(k)]


# -- the delay line's hold fault ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["head", "body"])
def test_the_delay_line_holds_a_response_then_lets_it_go(gcs, where):
    host, port = urllib.parse.urlsplit(gcs.endpoint).netloc.split(":")
    path = f"/download/storage/v1/b/{gcs.bucket}/o/stalls%2Fblob?alt=media"
    held = gcs.proxy_stats.held
    gcs.set_faults(hold_first=1, hold_s=0.5, hold_at=where)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        t0 = time.monotonic()
        conn.request("GET", path)
        resp = conn.getresponse()
        t_head = time.monotonic() - t0
        assert resp.read() == BLOB
        t_body = time.monotonic() - t0
        # Held where asked: before the head, or after it (the head came, the body waited).
        assert (t_head if where == "head" else t_body - t_head) >= 0.45, (t_head, t_body)
        assert gcs.proxy_stats.held == held + 1
        conn.request("GET", path)  # only the first download is held
        assert conn.getresponse().read() == BLOB
    finally:
        conn.close()
    assert gcs.proxy_stats.held == held + 1


# -- one read ----------------------------------------------------------------------------------


async def test_one_stalled_request_is_hedged_and_does_not_stall_the_batch(gcs):
    """Default hedging: a range GET held 30 s among 16 costs about the hedge delay (~0.5 s),
    not the stall. The idle timeout is 30 s too, so only the hedge can end it sooner."""
    stall_s = 30.0
    storage = Storage(storage_options=gcs.storage_options,
                      retry=RetryPolicy(timeout=stall_s, deadline=2 * stall_s))
    url = gcs.url("stalls/blob")
    try:
        await storage.read(url, 0, 100)  # the session is up, a latency is known
        held = gcs.proxy_stats.held
        gcs.set_faults(hold_first=1, hold_s=stall_s)
        got, took = await _timed(storage.read_many([(url, s, e) for s, e in _ranges(16)]), 20)
        assert got == [BLOB[s:e] for s, e in _ranges(16)]
        assert took < stall_s / 3, f"one stalled request held the batch {took:.2f} s"
        io = storage.stats.as_dict()
        assert io["hedges"] == io["hedge_wins"] == 1 and io["retries"] == 0
        assert io["requests"] == 1 + 16 + 1  # the warm-up, the batch, the hedge
        assert gcs.proxy_stats.held == held + 1
    finally:
        await storage.aclose()


async def test_a_silent_request_is_retried_after_the_idle_timeout(gcs):
    """Hedging off, defaults otherwise: a request that never answers costs `timeout` (3 s)."""
    storage = Storage(storage_options=gcs.storage_options, retry=NO_HEDGE)
    try:
        gcs.set_faults(hold_first=1, hold_s=math.inf)
        got, took = await _timed(storage.read(gcs.url("stalls/blob"), 10, 5000), 12)
        assert got == BLOB[10:5000]
        # retried after one idle timeout (not at once, not after two); the statuses say why
        assert NO_HEDGE.timeout * 0.9 < took < 2 * NO_HEDGE.timeout, took
        io = storage.stats.as_dict()
        assert io["retries"] == 1 and io["hedges"] == 0
        assert io["statuses"] == {"no answer within 3 s": 1}
    finally:
        await storage.aclose()


@pytest.mark.parametrize("late", [0.0, 0.3])
async def test_a_caller_cancelling_a_stalled_read_is_never_turned_into_a_retry(gcs, late):
    """A read's attempt ends itself by cancelling its own task (silence, a hedge that won);
    the caller's own cancellation must still come out as one: cancelled while waiting, or
    in the same turn as the attempt's timer fell due (`late`: the timer's own time)."""
    policy = RetryPolicy(timeout=0.3, deadline=30, hedge_after=None)
    storage = Storage(storage_options=gcs.storage_options, retry=policy)
    try:
        gcs.set_faults(hold_rate=1.0, hold_s=math.inf)
        read = asyncio.ensure_future(storage.read(gcs.url("stalls/blob"), 100, 300))
        await asyncio.sleep(0.1)
        if late:  # cancel from a callback due with the attempt's silence timer
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + late - 0.1, read.cancel)
            await asyncio.wait([read], timeout=5)
        else:
            read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert storage.stats.failures == 0
    finally:
        await storage.aclose()


@pytest.mark.parametrize("policy", [
    RetryPolicy(deadline=3),  # the idle timeout (3 s) and the deadline agree: no retry
    RetryPolicy(timeout=30, deadline=1.5),  # no attempt outlives the deadline
])
async def test_the_deadline_bounds_every_attempt(gcs, policy):
    storage = Storage(storage_options=gcs.storage_options, retry=policy)
    try:
        gcs.set_faults(hold_rate=1.0, hold_s=math.inf)  # the bucket stops answering
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:  # not the guard's TimeoutError:
            await asyncio.wait_for(storage.read(gcs.url("stalls/blob"), 100, 300), 15)
        assert time.monotonic() - t0 > policy.deadline * 0.9  # the deadline, not sooner
        # One attempt (and its hedge), ended by the deadline: none started after it, none
        # left to a 30 s idle timeout (that would end in the guard's TimeoutError).
        io = storage.stats
        assert io.retries == 0 and io.requests == 1 + io.hedges and io.failures == 1
        msg = str(info.value)
        assert "stalls/blob" in msg and "bytes [100, 300)" in msg
        assert "no answer" in msg and "deadline" in msg
    finally:
        await storage.aclose()


async def test_a_read_queued_behind_our_own_slots_is_not_timed_out():
    """The deadline times the store, not our own queue: 24 reads at once with 2 in flight
    and ~0.2 s a request wait up to ~2.4 s for a slot, beyond the 1 s deadline each has; a
    read's deadline starts when it first holds a slot."""
    with local_gcs(latency_ms=200) as g:
        g.upload_bytes(BLOB, "queue/blob")
        storage = Storage(storage_options=g.storage_options, concurrency=2,
                          retry=RetryPolicy(deadline=1.0, timeout=1.0, hedge_after=None))
        try:
            spans = [(k * 100, k * 100 + 50) for k in range(24)]
            t0 = time.monotonic()
            got = await asyncio.gather(*(storage.read(g.url("queue/blob"), a, b)
                                         for a, b in spans))
            assert time.monotonic() - t0 > 2.0  # the queue did form
            assert got == [BLOB[a:b] for a, b in spans]
            assert storage.stats.failures == 0 and storage.stats.retries == 0
        finally:
            await storage.aclose()


async def test_a_store_read_through_fsspec_is_bounded_by_the_deadline(gcs):
    """fsspec stores answer whole (no progress to watch): the deadline bounds the attempt.
    The idle timeout is 30 s, so only the deadline can end the read before the guard."""
    policy = RetryPolicy(deadline=1.5, timeout=30)
    url = f"{gcs.endpoint}/download/storage/v1/b/{gcs.bucket}/o/stalls%2Fblob?alt=media"
    storage = Storage(retry=policy)  # http:// goes through fsspec's HTTPFileSystem
    try:
        assert await storage.read(url, 0, 100) == BLOB[:100]
        gcs.set_faults(hold_rate=1.0, hold_s=math.inf)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError, match=r"bytes \[100, 300\).*deadline"):
            await asyncio.wait_for(storage.read(url, 100, 300), 10)  # else a TimeoutError
        assert time.monotonic() - t0 > policy.deadline * 0.9
    finally:
        await storage.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["head", "body"])
async def test_with_defaults_a_stalled_bucket_is_reported_within_15_s(gcs, where):
    storage = Storage(storage_options=gcs.storage_options)
    try:
        gcs.set_faults(hold_rate=1.0, hold_s=math.inf, hold_at=where)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError, match=r"stalls/blob.*bytes \[0, 200000\)"):
            await asyncio.wait_for(storage.read(gcs.url("stalls/blob"), 0, 200_000), 25)
        assert time.monotonic() - t0 < 15
    finally:
        await storage.aclose()


@pytest.mark.parametrize("into", [False, True])
async def test_a_slow_but_progressing_read_is_never_killed(into):
    """Bytes trickle in for ~2.5 s; the idle timeout (1 s) and deadline (1.5 s) never fire."""
    policy = RetryPolicy(timeout=1.0, deadline=1.5)
    with local_gcs(bandwidth_bytes_per_s=256 << 10) as slow:
        url = slow.upload_bytes(BLOB * 3, "trickle")
        n = 640 << 10
        storage = Storage(storage_options=slow.storage_options, retry=policy)
        try:
            if into:
                dest = bytearray(n)
                read = storage.read_into(url, 0, n, memoryview(dest))
            else:
                read = storage.read(url, 0, n)
            got, took = await _timed(read, 20)
            assert (dest if into else got) == (BLOB * 3)[:n]
            assert took > 2.0  # it really trickled for longer than timeout and deadline
            io = storage.stats.as_dict()
            assert io["requests"] == 1 and io["retries"] == 0
        finally:
            await storage.aclose()


async def test_hedges_are_bounded_by_the_budget(gcs):
    """Every download held 0.6 s: a hedge for the first few slow reads, then only ~5%."""
    policy = RetryPolicy(hedge_after=0.1)
    storage = Storage(storage_options=gcs.storage_options, retry=policy)
    url = gcs.url("stalls/blob")
    try:
        gcs.set_faults(hold_rate=1.0, hold_s=0.6)
        ranges = _ranges(60)
        got = await asyncio.wait_for(storage.read_many([(url, s, e) for s, e in ranges]), 20)
        assert got == [BLOB[s:e] for s, e in ranges]
        io = storage.stats.as_dict()
        assert 1 <= io["hedges"] <= policy.max_hedges + policy.hedge_budget * 60
        assert io["requests"] == 60 + io["hedges"] and io["retries"] == 0
    finally:
        await storage.aclose()


def test_policy_is_validated_and_its_defaults_report_a_stall_within_15_s():
    p = RetryPolicy()
    assert p.timeout + p.deadline <= 15  # a stall mid-body just before the deadline
    for bad in ({"timeout": 0}, {"deadline": -1}, {"attempts": 0}, {"hedge_budget": 2},
                {"hedge_after": -0.1}, {"max_hedges": -1}, {"hedge_multiplier": 0}):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


@given(st.lists(st.floats(0, 100), min_size=1, max_size=300))
def test_the_latency_estimate_is_the_median_of_the_last_64(samples):
    m = _Median()
    for k, x in enumerate(samples, 1):
        m.add(x)
        if k % 8 == 0 or k == 1:
            window = samples[max(0, k - 64):k]
            assert m.value == sorted(window)[len(window) // 2]


# -- an epoch ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    return rc.write_shards(tmp_path_factory.mktemp("stall-shards"), 1200, 2)


def test_stalled_requests_in_an_epoch_are_hedged_and_the_batches_unchanged(gcs, shards):
    """Three downloads held 30 s each, with a 30 s idle timeout: only hedges end them
    sooner. The stalled epoch is timed against the same epoch without stalls."""
    stall_s = 30.0
    retry = RetryPolicy(timeout=stall_s, deadline=2 * stall_s)
    urls = [gcs.upload(p, f"epoch/{p.rsplit('/', 1)[1]}") for p in shards]
    ds = rc.pipeline(urls, storage_options=gcs.storage_options)

    def epoch(stall: bool) -> tuple[list[list[int]], float, al.loader.Loader]:
        it = ds.loader(workers=0, max_gap=0, resident_bytes=0, retry=retry)
        out, t0 = [], 0.0
        for batch in it:
            out.append(rc.ids_of(batch))
            if len(out) == 1:  # files are open: from here, time the epoch
                t0 = time.monotonic()
                if stall:
                    gcs.set_faults(hold_first=3, hold_s=stall_s)
        return out, time.monotonic() - t0, it

    ref, ref_took, _ = epoch(False)
    held = gcs.proxy_stats.held
    got, took, it = epoch(True)
    assert got == ref
    # none of the stalls was waited out (each costs about a hedge delay, ~0.5 s)
    assert took < ref_took + stall_s / 3, f"three stalled requests cost {took - ref_took:.2f} s"
    assert gcs.proxy_stats.held == held + 3
    io = it.stats().io
    assert io["hedges"] >= 3 and io["retries"] == 0
    assert "hedges" in str(it.stats())
