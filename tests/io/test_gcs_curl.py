"""The libcurl gs:// backend against the emulator over real HTTP, and how a backend is chosen.

The reliability, stall and secret suites run on whichever client `gcs_client_for()` picks
(curl when pycurl is installed); this file pins each client explicitly and compares the
libcurl reads byte for byte with gcsfs's own (the "fsspec" client).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aioloader.io.gcs.client import GcsfsBackend
from aioloader.io.storage import (
    ObjectChangedError,
    RetryPolicy,
    Storage,
    StorageError,
    gcs_backend,
    gcs_client_for,
)
from aioloader.testing import local_gcs

pycurl = pytest.importorskip("pycurl")
from aioloader.io.gcs.backend import CurlGCSBackend  # noqa: E402

BLOB = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
FAST = RetryPolicy(attempts=20, base_delay=0.001, max_delay=0.01, hedge_after=None)


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True, seed=11) as g:
        g.upload_bytes(BLOB, "curl/blob")
        g.upload_bytes(b"", "curl/empty")
        g.upload_bytes(b"x" * 10, "curl/dir name/ü+%.bin")
        yield g


@pytest.fixture(autouse=True)
def _no_faults(gcs):
    gcs.set_faults()
    yield
    gcs.set_faults()


def _storage(gcs, client: str, **kw) -> Storage:
    return Storage(storage_options=gcs.storage_options, gcs_client=client, **kw)


async def test_reads_are_byte_identical_to_the_object_and_to_gcsfs(gcs):
    url = gcs.url("curl/blob")
    rng = np.random.default_rng(2)
    spans = [(0, 1), (0, len(BLOB)), (len(BLOB) - 1, len(BLOB))]
    spans += [tuple(sorted(rng.integers(0, len(BLOB), 2).tolist())) for _ in range(200)]
    spans = [(s, e) for s, e in spans if e > s]
    curl, aio = _storage(gcs, "curl"), _storage(gcs, "fsspec")
    try:
        assert isinstance(curl.stores.route(url)[0], CurlGCSBackend)
        assert isinstance(aio.stores.route(url)[0], GcsfsBackend)
        got = await curl.read_many([(url, s, e) for s, e in spans])
        ref = await aio.read_many([(url, s, e) for s, e in spans])
        assert got == ref == [BLOB[s:e] for s, e in spans]
        dest = bytearray(len(BLOB) - 7)
        await curl.read_into(url, 7, len(BLOB), memoryview(dest))
        assert dest == BLOB[7:]
        aio_dest = bytearray(len(BLOB) - 7)
        await aio.read_into(url, 7, len(BLOB), memoryview(aio_dest))
        assert aio_dest == BLOB[7:]
        for n in (1, 1000, len(BLOB), len(BLOB) + 5):
            # gcsfs opens with a metadata lookup: the same size and generation, no tail
            (info, tail), (ref_info, ref_tail) = (await curl.read_tail(url, n),
                                                  await aio.read_tail(url, n))
            assert info == ref_info and ref_tail is None
            assert info.size == len(BLOB) and tail == BLOB[-n:]
        odd = gcs.url("curl/dir name/ü+%.bin")  # names are quoted like gcsfs quotes them
        assert await curl.read(odd, 2, 9) == b"x" * 7
        info, tail = await curl.read_tail(gcs.url("curl/empty"), 100)
        assert info.size == 0 and not tail
    finally:
        await curl.aclose()
        await aio.aclose()


@pytest.mark.parametrize("client", ["curl", "fsspec"])
async def test_injected_503_and_429_are_retried(gcs, client):
    """By the RetryPolicy, each attempt one request: gcsfs's own retry loop is not used."""
    storage = _storage(gcs, client, retry=FAST)
    try:
        gcs.set_faults(error_rate=0.3, statuses=(503, 429))
        url = gcs.url("curl/blob")
        got = await storage.read_many([(url, i * 1000, i * 1000 + 1000) for i in range(100)])
        assert got == [BLOB[i * 1000 : i * 1000 + 1000] for i in range(100)]
        io = storage.stats.as_dict()
        assert io["retries"] >= 10 and io["failures"] == 0
        assert set(io["statuses"]) <= {"HTTP 503", "HTTP 429"}
    finally:
        await storage.aclose()


@pytest.mark.parametrize("client", ["curl", "fsspec"])
async def test_a_missing_object_is_a_clear_file_not_found(gcs, client):
    storage = _storage(gcs, client)
    try:
        with pytest.raises(FileNotFoundError, match="curl/nope"):
            await storage.read(gcs.url("curl/nope"), 0, 10)
        with pytest.raises(FileNotFoundError, match="no such file or object"):
            await storage.read_tail(gcs.url("curl/nope"), 10)
        assert storage.stats.retries == 0
    finally:
        await storage.aclose()


@pytest.mark.parametrize("client", ["curl", "fsspec"])
async def test_a_rewritten_object_is_refused_not_mixed(gcs, client):
    name = f"curl/rewritten-{client}"
    gcs.upload_bytes(b"a" * 100, name)
    storage = _storage(gcs, client)
    try:
        url = gcs.url(name)
        storage.pin(await storage.info(url))
        assert await storage.read(url, 0, 10) == b"a" * 10
        gcs.upload_bytes(b"b" * 100, name)
        with pytest.raises(ObjectChangedError, match="rewritten"):
            await storage.read(url, 0, 10)
    finally:
        await storage.aclose()


@pytest.mark.parametrize("client", ["curl", "fsspec"])
async def test_a_stalled_read_is_retried_after_the_idle_timeout_then_given_up(gcs, client):
    policy = RetryPolicy(timeout=0.3, deadline=1.5, hedge_after=None)
    storage = _storage(gcs, client, retry=policy)
    try:
        gcs.set_faults(hold_first=1, hold_s=math.inf)
        assert await storage.read(gcs.url("curl/blob"), 5, 500) == BLOB[5:500]
        assert storage.stats.statuses == {"no answer within 0.3 s": 1}
        gcs.set_faults(stall=True)
        with pytest.raises(TimeoutError, match="curl/blob"):
            await storage.read(gcs.url("curl/blob"), 5, 500)
    finally:
        await storage.aclose()


async def test_gcsfs_reads_hold_as_many_connections_as_reads_in_flight(gcs):
    """The fsspec client's session is sized by the concurrency (gcsfs's default holds 100)."""
    storage = _storage(gcs, "fsspec", concurrency=256, retry=FAST)
    url = gcs.url("curl/blob")
    try:
        assert await storage.read(url, 0, 10) == BLOB[:10]
        backend = storage.stores.route(url)[0]
        assert isinstance(backend, GcsfsBackend)
        assert backend._fs.session.connector.limit == 256 + FAST.max_hedges
    finally:
        await storage.aclose()


@pytest.mark.parametrize("client", [
    pytest.param("curl", marks=pytest.mark.xfail(
        strict=True, reason="libcurl re-sends a request once itself when a reused connection "
        "dies before any answer (its own rule; no option turns it off)")),
    "fsspec",
])
async def test_a_reset_connection_is_a_retry_the_policy_counts(gcs, client):
    """A kept-alive connection reset under a request: the attempt fails and the RetryPolicy
    sends the next one (no silent re-send by the HTTP client, unseen by `stats.retries`)."""
    storage = _storage(gcs, client, retry=FAST)
    url = gcs.url("curl/blob")
    try:
        assert await storage.read(url, 0, 10) == BLOB[:10]  # a connection to keep alive
        resets = gcs.proxy_stats.resets
        gcs.set_faults(reset_first=1)
        assert await storage.read(url, 10, 20) == BLOB[10:20]
        assert gcs.proxy_stats.resets == resets + 1
        io = storage.stats.as_dict()
        assert io["retries"] == 1 and io["failures"] == 0, io
        assert sum(io["statuses"].values()) == 1, io
    finally:
        await storage.aclose()


# A 503 whose message says "invalid": gcsfs's own checks take any such answer for a 400.
INVALID_503 = json.dumps({"error": {"code": 503, "message": "invalid upstream state, retry",
                                    "errors": [{"reason": "backendError"}]}})


@pytest.mark.parametrize("client", ["curl", "fsspec"])
async def test_server_errors_are_told_and_retried_by_their_status(gcs, client):
    storage = _storage(gcs, client, retry=FAST)
    url = gcs.url("curl/blob")
    try:
        gcs.set_faults(error_first=2, statuses=(503,), error_body=INVALID_503)
        assert await storage.read(url, 0, 100) == BLOB[:100]
        gcs.set_faults(error_first=2, statuses=(502,))
        assert await storage.read(url, 100, 200) == BLOB[100:200]
        io = storage.stats.as_dict()
        assert io["statuses"] == {"HTTP 503": 2, "HTTP 502": 2}, io
        assert io["retries"] == 4 and io["failures"] == 0, io
    finally:
        await storage.aclose()


@pytest.mark.parametrize("client", ["curl", "fsspec"])
@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_lookup_or_listing_is_a_permission_error(gcs, client, status,
                                                                 monkeypatch):
    """Both clients look objects up and list through gcsfs: a refusal is a `PermissionError`
    (an `OSError`, as gcsfs raised it) naming the object and what to check, not the token."""
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")  # (no token lookup at Google)
    secret = "ya29.s3cr3t-access-token"
    storage = Storage(storage_options={"token": secret, "endpoint_url": gcs.endpoint},
                      gcs_client=client)
    try:
        gcs.set_faults(error_rate=1.0, statuses=(status,))
        for lookup, name in ((storage.info, "curl/blob"), (storage.glob, "curl/*.bin")):
            with pytest.raises(PermissionError) as err:
                await lookup(gcs.url(name))
            msg = str(err.value)
            assert msg.startswith(f"HTTP {status} reading gs://{gcs.bucket}/{name}: "), msg
            assert msg.endswith("(check credentials or storage_options['token'])"), msg
            assert secret not in msg and secret not in repr(err.value)
    finally:
        gcs.set_faults()
        await storage.aclose()


async def test_concurrent_reads_on_a_new_session_do_not_wait_for_one_answer(gcs):
    """Over plain HTTP/1.1 nothing can be multiplexed: reads started at once each open their
    own connection at once, none waits on another's answer. (libcurl's PIPEWAIT made them
    wait for the first connection's response: one round trip more on every cold start, and
    one stalled answer stalled them all until the retry timeout.)"""
    policy = RetryPolicy(timeout=30, deadline=60, hedge_after=None)
    storage = _storage(gcs, "curl", retry=policy)
    url = gcs.url("curl/blob")
    starts = (0, 100, 200, 300)
    try:
        gcs.set_faults(hold_first=1, hold_s=math.inf)  # whichever arrives first: never answered
        reads = [asyncio.ensure_future(storage.read(url, k, k + 100)) for k in starts]
        done, pending = await asyncio.wait(reads, timeout=10)
        assert len(done) == 3 and len(pending) == 1
        assert all(r.result() == BLOB[k : k + 100] for r, k in zip(reads, starts) if r in done)
    finally:
        for r in reads:
            r.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        await storage.aclose()


async def test_errors_show_no_credentials(gcs):
    secret = "s3cr3t-pw"
    port = gcs.endpoint.rsplit(":", 1)[1]
    opts = {"token": "anon", "endpoint_url": f"http://user:{secret}@127.0.0.1:1"}
    storage = Storage(storage_options=opts, gcs_client="curl",
                      retry=RetryPolicy(attempts=2, base_delay=0.001, deadline=2))
    try:
        with pytest.raises(OSError) as err:
            await storage.read(f"gs://{gcs.bucket}/curl/blob?X-Goog-Signature={secret}", 0, 9)
        assert secret not in str(err.value) and port
    finally:
        await storage.aclose()
    gcs.set_faults(error_rate=1.0, statuses=(403,))
    storage = _storage(gcs, "curl")
    try:
        with pytest.raises(PermissionError) as err:
            await storage.read(gcs.url(f"curl/blob?sig={secret}"), 0, 9)
        assert secret not in str(err.value)
    finally:
        await storage.aclose()


async def test_selection_auto_curl_fsspec_and_fallbacks(gcs, monkeypatch):
    opts, pins = gcs.storage_options, {}
    for client, want in (("auto", CurlGCSBackend), ("curl", CurlGCSBackend),
                         ("fsspec", GcsfsBackend)):
        backend = gcs_backend(client, opts, 8, pins)
        assert isinstance(backend, want)
        await backend.aclose()
    odd = {**opts, "requester_pays": True}  # read by gcsfs's own rules: gcsfs reads
    backend = gcs_backend("auto", odd, 8, pins)
    assert isinstance(backend, GcsfsBackend) and gcs_client_for("auto", odd) == "fsspec"
    await backend.aclose()
    with pytest.raises(StorageError, match="requester_pays"):
        gcs_backend("curl", odd, 8, pins)
    with pytest.raises(ValueError, match="gcs_client"):
        Storage(gcs_client="h2")
    monkeypatch.setitem(sys.modules, "pycurl", None)  # the extra not installed
    for mod in ("aioloader.io.gcs.curl", "aioloader.io.gcs.backend"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    backend = gcs_backend("auto", opts, 8, pins)
    assert isinstance(backend, GcsfsBackend)
    await backend.aclose()
    with pytest.raises(StorageError, match=r"aioloader\[gcs\]"):
        gcs_backend("curl", opts, 8, pins)


CHILD = r"""
import json, sys
import aioloader as al
spec = json.loads(sys.argv[1])
ds = al.Dataset.from_arrayrecord(spec["url"], storage_options=spec["opts"]).batch(4)
with ds.loader(workers=0) as it:
    batch = next(iter(it))
print(json.dumps({"n": len(batch), "gcsfs": "gcsfs" in sys.modules,
                  "aiohttp": "aiohttp" in sys.modules}))
"""


def test_a_named_file_is_read_without_importing_gcsfs_or_aiohttp(gcs, tmp_path):
    from ..support.arrayrecord_util import write_theirs

    path = tmp_path / "t.array_record"
    write_theirs(path, [b"r%d" % i for i in range(10)], "group_size:1")
    url = gcs.upload(path, "curl/t.array_record")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("AIOLOADER_GCS_CLIENT", None)
    out = subprocess.run([sys.executable, "-c", CHILD,
                          json.dumps({"url": url, "opts": gcs.storage_options})],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"n": 4, "gcsfs": False,
                                                       "aiohttp": False}
