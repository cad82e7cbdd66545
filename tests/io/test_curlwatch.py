"""The sockets libcurl asks to watch (`aioloader.io.gcs.curlwatch`), on real sockets.

`EpollWatch` leaves an idle connection's socket in its epoll. What must never happen: a
socket libcurl closed while idle, whose number a new socket then takes, left unwatched (a
transfer that hangs), or an idle socket that keeps the loop busy once its server closed it.
The same behaviour is asked of `LoopWatch`, where it applies.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pycurl = pytest.importorskip("pycurl")
from aioloader.io.gcs.curl import CurlSession  # noqa: E402
from aioloader.io.gcs.curlwatch import EpollWatch, LoopWatch  # noqa: E402

WATCHES = [LoopWatch, *([EpollWatch] if hasattr(select, "epoll") else [])]


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", WATCHES)
async def test_a_socket_is_handed_on_for_what_libcurl_asked_and_no_longer_once_let_go(kind):
    seen: list[tuple[int, int]] = []
    watch = kind(asyncio.get_running_loop(), lambda fd, ev: seen.append((fd, ev)))
    a, b = socket.socketpair()
    try:
        watch.set(a.fileno(), pycurl.POLL_IN)
        await _turns()
        assert seen == []  # nothing to read yet
        b.send(b"x")
        await _turns()
        assert seen and all(s == (a.fileno(), pycurl.CSELECT_IN) for s in seen)
        watch.set(a.fileno(), pycurl.POLL_REMOVE)
        a.recv(1)
        seen.clear()
        watch.set(a.fileno(), pycurl.POLL_OUT)  # writable at once
        await _turns()
        assert seen and seen[0] == (a.fileno(), pycurl.CSELECT_OUT)
        watch.set(a.fileno(), pycurl.POLL_REMOVE)  # a writable socket let go: never again
        await _turns(2)
        seen.clear()
        await _turns()
        assert seen == []
    finally:
        watch.close()
        a.close()
        b.close()


async def test_an_idle_socket_closed_and_its_number_reused_is_watched_again():
    seen: list[tuple[int, int]] = []
    watch = EpollWatch(asyncio.get_running_loop(), lambda fd, ev: seen.append((fd, ev)))
    a, b = socket.socketpair()
    c = d = None
    try:
        fd = a.fileno()
        watch.set(fd, pycurl.POLL_IN)
        watch.set(fd, pycurl.POLL_REMOVE)  # idle: left in the epoll
        a.close()  # libcurl closes it (no word to us); the kernel drops it from the epoll
        b.close()
        c, d = socket.socketpair()
        assert fd in (c.fileno(), d.fileno())  # the lowest number: the old one
        new = c if c.fileno() == fd else d
        other = d if new is c else c
        watch.set(fd, pycurl.POLL_IN)  # a new connection on that number
        other.send(b"y")
        await _turns()
        assert (fd, pycurl.CSELECT_IN) in seen  # watched: not left hanging
        assert new.recv(1) == b"y"
    finally:
        watch.close()
        for s in (a, b, c, d):
            if s is not None:
                s.close()


async def test_an_idle_socket_its_server_closed_does_not_keep_the_loop_busy():
    seen: list[tuple[int, int]] = []
    watch = EpollWatch(asyncio.get_running_loop(), lambda fd, ev: seen.append((fd, ev)))
    calls = 0
    events = watch._events

    def counted() -> None:
        nonlocal calls
        calls += 1
        events()

    watch._events = counted  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    loop.remove_reader(watch._epoll.fileno())
    loop.add_reader(watch._epoll.fileno(), counted)
    a, b = socket.socketpair()
    try:
        watch.set(a.fileno(), pycurl.POLL_IN)
        watch.set(a.fileno(), pycurl.POLL_REMOVE)
        b.close()  # the server closes the kept-alive connection: readable for good
        await _turns(10)
        assert seen == []  # libcurl is not asked about a socket it let go
        assert calls <= 2  # dropped from the epoll at the first event, not once per turn
    finally:
        watch.close()
        a.close()


class _KeepAlive(BaseHTTPRequestHandler):
    """HTTP/1.1, kept alive, and closed by the server after 0.2 s idle."""

    protocol_version = "HTTP/1.1"
    timeout = 0.2
    body = bytes(range(256)) * 16

    def do_GET(self) -> None:
        start, end = (int(x) for x in self.headers["Range"][6:].split("-"))
        part = self.body[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.body)}")
        self.end_headers()
        self.wfile.write(part)

    def log_message(self, *args) -> None:
        pass


async def test_reads_go_on_after_the_server_closed_every_idle_connection():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/o"
    session = CurlSession(16, multiplex=False)
    try:
        for _ in range(3):  # each round: 8 connections, then all closed by the server
            spans = [(k * 100, k * 100 + 50) for k in range(8)]
            got = await asyncio.wait_for(
                asyncio.gather(*(session.get(url, s, e, []) for s, e in spans)), 10)
            assert [r.body for r in got] == [_KeepAlive.body[s:e] for s, e in spans]
            await asyncio.sleep(0.5)  # the server closes them all; libcurl is not told
    finally:
        await session.aclose()
        server.shutdown()
        server.server_close()
