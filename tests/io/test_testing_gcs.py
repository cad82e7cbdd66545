"""The local GCS stand-in: fake-gcs-server lifecycle, gcsfs reads, the delay line and its faults."""

from __future__ import annotations

import asyncio
import contextlib
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
        assert time.perf_counter() - t0 >= latency  # a lower bound the delay guarantees
        assert gcs.proxy_stats.requests >= 2


async def test_concurrent_requests_overlap_their_latency() -> None:
    from gcsfs.core import GCSFileSystem

    latency, n = 0.5, 32  # one by one: >= 16 s; together: ~0.5 s
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
        # in flight together, not one by one: well under what one by one must take
        assert latency <= elapsed < n * latency / 4, elapsed


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
        gcs.set_faults(reset_rate=1.0)  # the new fault kinds reach the child too
        with pytest.raises(ConnectionResetError):
            _raw_get(gcs, "d")
        stats = gcs.proxy_stats
        assert stats.requests >= 3 and stats.faults == 1 and stats.resets == 1
    assert child.poll() is not None


def _raw_get(gcs, name: str, timeout: float = 5.0) -> bytes:
    """One GET on a fresh socket; everything the server sent until it closed."""
    host, port = _hostport(gcs.endpoint)
    path = f"/download/storage/v1/b/{gcs.bucket}/o/{name}?alt=media"
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_reset_rate_one_resets_every_connection_without_an_answer() -> None:
    with local_gcs(reset_rate=1.0) as gcs:
        assert gcs.endpoint != gcs.server_endpoint  # a reset rate alone starts the delay line
        gcs.upload_bytes(b"payload", "p")
        for _ in range(3):  # a raw socket sees an RST (ECONNRESET), not a clean close
            with pytest.raises(ConnectionResetError):
                _raw_get(gcs, "p")
        conn = http.client.HTTPConnection(*_hostport(gcs.endpoint), timeout=5)
        try:  # http.client: RemoteDisconnected or ECONNRESET, both ConnectionResetError
            with pytest.raises(ConnectionResetError):
                _get(conn, f"/download/storage/v1/b/{gcs.bucket}/o/p?alt=media")
        finally:
            conn.close()
        stats = gcs.proxy_stats
        assert (stats.requests, stats.downloads, stats.resets, stats.faults) == (4, 4, 4, 0)
        gcs.set_faults()
        assert _raw_get(gcs, "p").endswith(b"\r\n\r\npayload")
        assert gcs.fs().ls(gcs.bucket) == [f"{gcs.bucket}/p"]  # metadata: not a download
        stats = gcs.proxy_stats
        assert stats.downloads == 5 and stats.requests > 5 and stats.resets == 4


async def _aiohttp_get(url: str) -> bytes:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return await resp.read()


def test_reset_rate_is_a_seeded_fraction_and_aiohttp_sees_a_disconnect() -> None:
    import aiohttp

    with local_gcs(proxy=True, seed=3) as gcs:
        gcs.upload_bytes(b"payload", "p")
        gcs.set_faults(reset_rate=0.25)
        outcomes = []
        for _ in range(80):
            try:
                outcomes.append(_raw_get(gcs, "p").endswith(b"payload"))
            except ConnectionResetError:
                outcomes.append(False)
        resets = gcs.proxy_stats.resets
        assert outcomes.count(False) == resets and 8 <= resets <= 35
        gcs.set_faults(reset_rate=1.0)  # what the loader's HTTP client sees: retriable
        url = f"{gcs.endpoint}/download/storage/v1/b/{gcs.bucket}/o/p?alt=media"
        with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
            asyncio.run(_aiohttp_get(url))
    with local_gcs(proxy=True, seed=3) as again:  # same seed, same choices
        again.upload_bytes(b"payload", "p")
        again.set_faults(reset_rate=0.25)
        for _ in range(80):
            with contextlib.suppress(ConnectionResetError):
                _raw_get(again, "p")
        assert again.proxy_stats.resets == resets


def test_slow_body_forwards_the_head_then_holds_the_body() -> None:
    slow_s = 0.5
    with local_gcs(slow_rate=1.0, slow_s=slow_s) as gcs:
        gcs.upload_bytes(b"x" * 5000, "s")
        path = f"/download/storage/v1/b/{gcs.bucket}/o/s?alt=media"
        conn = http.client.HTTPConnection(*_hostport(gcs.endpoint), timeout=5)
        try:
            t0 = time.perf_counter()
            conn.request("GET", path)
            resp = conn.getresponse()  # the head is not held back
            t_head = time.perf_counter()
            assert resp.status == 200
            assert resp.read() == b"x" * 5000
            t_body = time.perf_counter()
            # the wait came after the head, so the head was not held (one hold a response)
            assert t_body - t_head >= slow_s * 0.95
            assert gcs.proxy_stats.slowed == 1
            gcs.set_faults()  # the same keep-alive connection is fast again
            assert _get(conn, path) == (200, b"x" * 5000)
            assert gcs.proxy_stats.slowed == 1
        finally:
            conn.close()
        gcs.set_faults(slow_rate=1.0, slow_s=slow_s)
        t0 = time.perf_counter()
        assert gcs.fs().cat_file(gcs.url("s"), 10, 20) == b"x" * 10  # ranged, through gcsfs
        assert time.perf_counter() - t0 >= slow_s * 0.95
        stats = gcs.proxy_stats
        assert stats.slowed >= 2 and stats.faults == stats.resets == 0


def test_fault_kinds_are_exclusive_and_validated() -> None:
    with local_gcs(proxy=True) as gcs:
        for bad in ({"reset_rate": 1.5}, {"slow_rate": -0.1}, {"slow_s": -1.0}):
            with pytest.raises(ValueError):
                gcs.set_faults(**bad)
        gcs.upload_bytes(b"payload", "p")
        # reset wins over an error status: the request is never answered
        gcs.set_faults(error_rate=1.0, reset_rate=1.0, slow_rate=1.0, slow_s=5.0)
        with pytest.raises(ConnectionResetError):
            _raw_get(gcs, "p")
        stats = gcs.proxy_stats
        assert (stats.resets, stats.faults, stats.slowed) == (1, 0, 0)
        # an error status wins over a slow body: the proxy's own reply is never held
        gcs.set_faults(error_rate=1.0, slow_rate=1.0, slow_s=5.0)
        conn = http.client.HTTPConnection(*_hostport(gcs.endpoint), timeout=5)
        try:
            t0 = time.perf_counter()
            assert _get(conn, f"/download/storage/v1/b/{gcs.bucket}/o/p?alt=media")[0] in (
                503, 429)
            assert time.perf_counter() - t0 < 2
        finally:
            conn.close()
        assert gcs.proxy_stats.slowed == 0


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
            for kind, data in line._requests.parse(conn, stream[i : i + step]):
                assert kind == "up"
                up += data
        assert up == stream
        assert line.stats.requests == 3 and line.stats.passthrough == 0

    line = _DelayLine(0, 0.0, 0.0, None, _Faults(error_rate=1.0, statuses=(503,)), seed=0)
    actions = line._requests.parse(_Conn(), stream)
    assert [kind for kind, _ in actions] == ["reply"] * 3  # bodies dropped, never forwarded
    assert all(data.startswith(b"HTTP/1.1 503 ") for _, data in actions)

    line = _DelayLine(0, 0.0, 0.0, None, _Faults(reset_rate=1.0), seed=0)
    conn = _Conn()
    # nothing forwarded, nothing after
    assert line._requests.parse(conn, stream) == [("reset", b"")]
    assert line._requests.parse(conn, stream) == []
    assert line.stats.requests == 1  # resets are counted when they happen, after the latency

    line = _DelayLine(0, 0.0, 0.0, None, _Faults(slow_rate=1.0, slow_s=0.25), seed=0)
    actions = line._requests.parse(_Conn(), stream)
    assert [kind for kind, _ in actions] == ["slow", "up"] * 3  # marked before its head
    assert b"".join(data for kind, data in actions if kind == "up") == stream
    assert {float(data) for kind, data in actions if kind == "slow"} == {0.25}

    line = _DelayLine(0, 0.0, 0.0, None, _Faults(error_rate=1.0), seed=0)
    tls = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    assert line._requests.parse(_Conn(), tls) == [("up", tls)]  # not HTTP: forwarded untouched
    assert line.stats.passthrough == 1


def test_cut_rate_sends_the_head_and_part_of_the_body_then_resets() -> None:
    """A response cut off mid-body: the client has the head and some of the body when the
    connection resets (what a network failure halfway through a large read looks like)."""
    body = bytes(range(256)) * 64  # 16 KiB
    with local_gcs(proxy=True) as gcs:
        gcs.upload_bytes(body, "b")
        gcs.set_faults(cut_rate=1.0)
        host, port = _hostport(gcs.endpoint)
        path = f"/download/storage/v1/b/{gcs.bucket}/o/b?alt=media"
        got = b""
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                         .encode())
            with pytest.raises(ConnectionResetError):
                while chunk := sock.recv(65536):
                    got += chunk
        head, _, part = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and 0 < len(part) < len(body)
        assert body.startswith(part)
        assert gcs.proxy_stats.cut == 1
        gcs.set_faults()
        assert _raw_get(gcs, "b").endswith(body)
        with pytest.raises(ValueError):
            gcs.set_faults(cut_rate=2.0)


@pytest.mark.parametrize("proxy_process", [False, True], ids=["thread", "process"])
def test_a_read_in_hand_is_already_counted(proxy_process) -> None:
    """The delay line counts a response's bytes before it sends them: a snapshot taken as
    soon as the client has a read holds all of its bytes (counted after the send, a test's
    delta could miss a read's bytes and give them to its next delta)."""
    data = os.urandom(64 << 10)
    with local_gcs(proxy=True, proxy_process=proxy_process) as gcs:
        url = gcs.upload_bytes(data, "counted.bin")
        fs = gcs.fs()
        for k in range(40):
            before = gcs.proxy_stats.bytes_down
            got = fs.cat_file(url, 0, 1000 + 1000 * k)
            assert len(got) == 1000 + 1000 * k
            assert gcs.proxy_stats.bytes_down - before >= len(got), k
