"""The local GCS stand-in: fake-gcs-server lifecycle, gcsfs reads, the delay line and its faults."""

from __future__ import annotations

import asyncio
import http.client
import os
import socket
import threading
import time
import urllib.parse

import pytest

from aioloader.testing import ProxyStats, local_gcs
from aioloader.testing.delayline import _Conn, _DelayLine, _Faults

PROXY_THREAD = "aioloader-delay-line"


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == PROXY_THREAD]


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    conn.request("GET", path)
    resp = conn.getresponse()
    return resp.status, resp.read()


def _hostport(endpoint: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(endpoint)
    assert u.hostname is not None and u.port is not None
    return u.hostname, u.port


def test_start_stop_leaves_no_process_thread_or_dir() -> None:
    with local_gcs(proxy=True) as gcs:
        proc, watchdog = gcs._server.proc, gcs._server.watchdog
        assert proc is not None and proc.poll() is None
        assert watchdog is not None and watchdog.poll() is None
        tmpdir = gcs.log_path.parent
        assert tmpdir.is_dir()
        assert len(_proxy_threads()) == 1
    for p in (proc, watchdog):
        assert p.poll() is not None  # exited and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(p.pid, 0)
    assert _proxy_threads() == []
    assert not tmpdir.exists()


def test_env_vars_set_inside_and_restored_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://before:1")
    monkeypatch.delenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", raising=False)
    with local_gcs(latency_ms=1) as gcs:
        assert gcs.endpoint != gcs.server_endpoint  # clients go through the delay line
        assert os.environ["STORAGE_EMULATOR_HOST"] == gcs.endpoint
        assert os.environ["CLOUD_STORAGE_EMULATOR_ENDPOINT"] == gcs.endpoint
        assert os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
    assert os.environ["STORAGE_EMULATOR_HOST"] == "http://before:1"
    assert "CLOUD_STORAGE_EMULATOR_ENDPOINT" not in os.environ


def test_upload_and_read_back_through_gcsfs(tmp_path) -> None:
    import fsspec

    data = os.urandom(300_000)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    with local_gcs() as gcs:
        assert gcs.endpoint == gcs.server_endpoint  # no delay line asked for
        url = gcs.upload(local, "dir/blob.bin")
        assert url == f"gs://{gcs.bucket}/dir/blob.bin" == gcs.url("dir/blob.bin")
        url2 = gcs.upload_bytes(b"hello world", "odd name+%.txt")

        fs = fsspec.filesystem("gs", token="anon", endpoint_url=gcs.endpoint,
                               skip_instance_cache=True)
        assert fs.cat_file(url) == data
        assert fs.cat_file(url, 1000, 70_000) == data[1000:70_000]
        assert fs.cat_file(url, len(data) - 5, len(data)) == data[-5:]
        assert fs.cat_file(url2) == b"hello world"
        assert gcs.fs().cat_file(url, 0, 10) == data[:10]
        assert gcs.list_objects() == {"dir/blob.bin": len(data), "odd name+%.txt": 11}

        gcs.delete("dir/blob.bin")
        assert gcs.list_objects() == {"odd name+%.txt": 11}
        with pytest.raises(FileNotFoundError):
            gcs.delete("dir/blob.bin")


def test_filesystem_root_keeps_objects_between_runs(tmp_path) -> None:
    with local_gcs(root=tmp_path / "store") as gcs:
        gcs.upload_bytes(b"kept", "k")
    with local_gcs(root=tmp_path / "store") as gcs:
        assert gcs.list_objects() == {"k": 4}
        assert gcs.fs().cat_file(gcs.url("k")) == b"kept"


def test_latency_is_added_to_each_request() -> None:
    latency = 0.1
    with local_gcs(latency_ms=latency * 1e3) as gcs:
        url = gcs.upload_bytes(b"x" * 1000, "x")
        fs = gcs.fs()
        assert fs.cat_file(url, 0, 10) == b"x" * 10  # opens the connection
        t0 = time.perf_counter()
        assert fs.cat_file(url, 10, 20) == b"x" * 10  # a reused keep-alive connection
        elapsed = time.perf_counter() - t0
        assert latency <= elapsed < latency + 1.0
        assert gcs.proxy_stats.requests >= 2


async def test_concurrent_requests_overlap_their_latency() -> None:
    from gcsfs.core import GCSFileSystem

    latency, n = 0.1, 16
    with local_gcs(latency_ms=latency * 1e3, jitter_ms=5) as gcs:
        url = gcs.upload_bytes(bytes(range(256)) * 64, "blob")
        fs = GCSFileSystem(asynchronous=True, skip_instance_cache=True, **gcs.storage_options)
        session = await fs._set_session()
        try:
            t0 = time.perf_counter()
            got = await asyncio.gather(*(fs._cat_file(url, i, i + 100) for i in range(n)))
            elapsed = time.perf_counter() - t0
        finally:
            await session.close()
        assert got == [(bytes(range(256)) * 64)[i : i + 100] for i in range(n)]
        assert latency <= elapsed < n * latency / 2  # in flight together, not one by one


def test_bandwidth_cap_slows_downloads() -> None:
    size, rate = 200_000, 1_000_000
    with local_gcs(bandwidth_bytes_per_s=rate) as gcs:
        url = gcs.upload_bytes(b"b" * size, "big")
        t0 = time.perf_counter()
        assert gcs.fs().cat_file(url, 0, size) == b"b" * size
        assert time.perf_counter() - t0 >= 0.8 * size / rate


def test_error_rate_one_answers_503_or_429_and_keeps_the_connection() -> None:
    with local_gcs(error_rate=1.0) as gcs:
        gcs.upload_bytes(b"payload", "p")
        path = f"/download/storage/v1/b/{gcs.bucket}/o/p?alt=media"
        conn = http.client.HTTPConnection(*_hostport(gcs.endpoint), timeout=5)
        try:
            statuses = {_get(conn, path)[0] for _ in range(20)}
            assert statuses == {503, 429}  # seeded; both show up in 20
            assert gcs.proxy_stats.faults == 20
            gcs.set_faults(error_rate=0.0)  # takes effect mid-connection
            assert _get(conn, path) == (200, b"payload")
            gcs.set_faults(error_rate=1.0, statuses=(500,))
            assert _get(conn, path)[0] == 500
        finally:
            conn.close()
        stats = gcs.proxy_stats
        assert (stats.requests, stats.faults, stats.connections) == (22, 21, 1)


def test_stall_makes_requests_time_out_then_recovers() -> None:
    with local_gcs(proxy=True) as gcs:
        gcs.upload_bytes(b"payload", "p")
        path = f"/download/storage/v1/b/{gcs.bucket}/o/p?alt=media"
        gcs.set_faults(stall=True)
        conn = http.client.HTTPConnection(*_hostport(gcs.endpoint), timeout=0.3)
        t0 = time.perf_counter()
        with pytest.raises((TimeoutError, socket.timeout)):
            _get(conn, path)
        assert time.perf_counter() - t0 >= 0.3
        conn.close()
        assert gcs.proxy_stats.stalled == 1
        gcs.set_faults(stall=False)
        conn = http.client.HTTPConnection(*_hostport(gcs.endpoint), timeout=5)
        try:
            assert _get(conn, path) == (200, b"payload")
        finally:
            conn.close()


def test_delay_line_in_a_child_process() -> None:
    latency = 0.05
    with local_gcs(latency_ms=latency * 1e3, proxy_process=True) as gcs:
        child = gcs._proxy._proc  # type: ignore[union-attr]
        assert _proxy_threads() == []
        url = gcs.upload_bytes(b"0123456789", "d")
        t0 = time.perf_counter()
        assert gcs.fs().cat_file(url, 2, 5) == b"234"
        assert time.perf_counter() - t0 >= latency
        gcs.set_faults(error_rate=1.0, statuses=(429,))
        conn = http.client.HTTPConnection(*_hostport(gcs.endpoint), timeout=5)
        try:
            assert _get(conn, f"/download/storage/v1/b/{gcs.bucket}/o/d?alt=media")[0] == 429
        finally:
            conn.close()
        stats = gcs.proxy_stats
        assert stats.requests >= 2 and stats.faults == 1
    assert child.poll() is not None


def test_set_faults_needs_a_delay_line() -> None:
    with local_gcs() as gcs:
        assert gcs.proxy_stats == ProxyStats()
        with pytest.raises(RuntimeError, match="proxy=True"):
            gcs.set_faults(error_rate=0.5)


def test_request_framing_survives_any_split() -> None:
    """Heads, bodies and several keep-alive requests split at every byte still frame exactly."""
    stream = (
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /b HTTP/1.1\r\nContent-Length: 5\r\nHost: x\r\n\r\nhello"
        b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    for step in (1, 3, 7, len(stream)):
        line = _DelayLine(0, 0.0, 0.0, None, _Faults(), seed=0)
        conn = _Conn()
        up = b""
        for i in range(0, len(stream), step):
            for kind, data in line._parse(conn, stream[i : i + step]):
                assert kind == "up"
                up += data
        assert up == stream
        assert line.stats.requests == 3 and line.stats.passthrough == 0

    line = _DelayLine(0, 0.0, 0.0, None, _Faults(error_rate=1.0, statuses=(503,)), seed=0)
    actions = line._parse(_Conn(), stream)
    assert [kind for kind, _ in actions] == ["reply"] * 3  # bodies dropped, never forwarded
    assert all(data.startswith(b"HTTP/1.1 503 ") for _, data in actions)

    line = _DelayLine(0, 0.0, 0.0, None, _Faults(error_rate=1.0), seed=0)
    tls = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    assert line._parse(_Conn(), tls) == [("up", tls)]  # not HTTP: forwarded untouched
    assert line.stats.passthrough == 1
