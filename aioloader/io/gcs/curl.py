"""HTTP GETs on libcurl's multi interface, driven by the asyncio event loop.

Why: a Python HTTP client spends its CPU per request on request and response objects,
header parsing and stream readers, which caps record-by-record reads from a bucket per
process. libcurl does the HTTP work in C; what is left in Python per GET is a handful of
`setopt` calls, one body callback and one completion (figures: benchmarks/RESULTS.md, "cost
per request").

How: one `CurlMulti` per event loop. libcurl tells us which sockets to watch and when its
timer is due (`M_SOCKETFUNCTION`, `M_TIMERFUNCTION`); the sockets are watched by one epoll
of our own that the loop watches (`curlwatch`), the timer by `call_at`, both calling back
into `socket_action`, and finished transfers complete their futures.
No thread, no timeouts of its own: a request reports what it receives to a `retry.Watch`
and the caller's retry policy times silence and cancels; a cancelled transfer is removed
from the multi handle (libcurl closes its connection).

Requests carry no `Accept-Encoding` (bytes are returned as stored), follow no redirects and
are not retried by libcurl. Over https libcurl negotiates HTTP/2 by ALPN and multiplexes
requests on few connections; over http (emulators) it keeps HTTP/1.1 connections alive.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pycurl

from ...errors import StorageError, Transient, Unreachable
from .curlwatch import new_watch

__all__ = ["CurlSession", "Response"]

_FINAL_ERRORS = frozenset({pycurl.E_UNSUPPORTED_PROTOCOL, pycurl.E_URL_MALFORMAT})
# No connection at all (no such host, refused, no route): retried briefly (`Unreachable`).
_CONNECT_ERRORS = frozenset({pycurl.E_COULDNT_RESOLVE_HOST, pycurl.E_COULDNT_RESOLVE_PROXY,
                             pycurl.E_COULDNT_CONNECT})
_ERROR_TEXT = 200  # bytes of an error answer's body kept for the message


class Response:
    """One transfer: its status, its body (or bytes written into `dest`), headers if asked.

    `write` is libcurl's body callback. A transfer into `dest` also takes the header callback,
    which learns the status from the status line, so an error answer's body never lands in
    `dest` (libcurl's handle cannot be asked for the status mid-transfer).
    """

    __slots__ = ("chunks", "curl", "dest", "got", "headers", "n", "status", "watch")

    def __init__(self, curl: Any, n: int, dest: memoryview | None, watch: Any,
                 headers: list[bytes] | None) -> None:
        self.curl = curl
        self.n = n
        self.dest = dest
        self.watch = watch
        self.headers = headers
        self.chunks: list[bytes] = []
        self.got = 0
        self.status = 0

    def write(self, chunk: bytes) -> int | None:
        watch = self.watch
        if watch is not None:
            if self.got or self.chunks:
                watch.progress()
            else:
                watch.answered()
        k = len(chunk)
        if self.dest is not None and self.status == 206:
            if self.got + k > self.n:
                self.status = -1  # long body: abort (E_WRITE_ERROR)
                return 0
            self.dest[self.got : self.got + k] = chunk
        elif self.dest is None or self.status == 200 or self.got < _ERROR_TEXT:
            self.chunks.append(chunk)  # (200: the whole object, the range was ignored)
        self.got += k
        return None

    def header(self, line: bytes) -> None:
        """libcurl's header callback (asked for when writing into `dest`, or for headers):
        the status is known before the body (libcurl's handle cannot be asked mid-transfer)."""
        if line[:5] == b"HTTP/":
            self.status = int(line.split(None, 2)[1])
            if self.headers is not None:
                self.headers.clear()  # a new response (after 100 Continue)
        elif self.headers is not None:
            self.headers.append(line)

    @property
    def body(self) -> bytes:
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def header_value(self, name: str) -> str:
        """The last value of header `name` (case-insensitive), "" when absent."""
        want = name.lower().encode() + b":"
        for line in reversed(self.headers or ()):
            if line[: len(want)].lower() == want:
                return line[len(want) :].strip().decode("latin-1")
        return ""


class CurlSession:
    """GETs on one event loop through one libcurl multi handle (a shared connection pool)."""

    def __init__(self, connections: int, *, multiplex: bool = True) -> None:
        """`multiplex`: the endpoint may speak HTTP/2 (https): a transfer then waits for a
        connection being opened rather than opening another. Over plain http (HTTP/1.1)
        that wait is a round trip lost on every cold start, and one stalled answer holds
        every transfer that waited on its connection: so there, never wait."""
        self._loop = asyncio.get_running_loop()
        self._pipewait = int(multiplex)
        self._multi = multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        multi.setopt(pycurl.M_MAXCONNECTS, max(4, connections))  # keep them all alive
        self._free: list[Any] = []
        self._running: dict[Any, tuple[asyncio.Future, Response]] = {}
        self._timer: asyncio.Handle | None = None
        self._due = 0.0
        self._watch = new_watch(self._loop, self._act)  # the sockets libcurl asks to watch
        self._closed = False

    def _new_handle(self) -> Any:
        c = pycurl.Curl()
        c.setopt(pycurl.NOSIGNAL, 1)
        c.setopt(pycurl.FOLLOWLOCATION, 0)
        c.setopt(pycurl.TCP_NODELAY, 1)
        c.setopt(pycurl.PIPEWAIT, self._pipewait)  # see __init__
        return c

    async def get(self, url: str, start: int | None, end: int | None, auth: list[str],
                  *, dest: memoryview | None = None, watch: Any = None,
                  headers: bool = False) -> Response:
        """GET `url`, bytes `[start, end)` (`start=None`: the last `end` bytes; both None:
        all). Returns the finished transfer; raises `Transient` for network failures."""
        if self._closed:
            raise StorageError("the HTTP session is closed")
        c = self._free.pop() if self._free else self._new_handle()
        n = (end - start) if start is not None and end is not None else 0
        resp = Response(c, n, dest, watch, [] if headers else None)
        c.setopt(pycurl.URL, url)
        if start is None:
            c.setopt(pycurl.RANGE, f"-{end}" if end is not None else None)
        else:
            c.setopt(pycurl.RANGE, f"{start}-{end - 1}")  # type: ignore[operator]
        c.setopt(pycurl.HTTPHEADER, auth)
        c.setopt(pycurl.WRITEFUNCTION, resp.write)
        if headers or dest is not None:
            c.setopt(pycurl.HEADERFUNCTION, resp.header)
        fut = self._loop.create_future()
        self._multi.add_handle(c)  # libcurl sets its timer to 0: started on the next turn
        self._running[c] = (fut, resp)
        try:
            err = await fut
        except BaseException:  # cancelled (silence, a hedge won): abandon the transfer
            if self._running.pop(c, None) is not None:
                self._multi.remove_handle(c)
            self._release(c, resp)
            raise
        if err is None:
            resp.status = c.getinfo(pycurl.RESPONSE_CODE)
        self._release(c, resp)
        if err is not None:
            code, msg = err
            if code == pycurl.E_WRITE_ERROR and resp.status == -1:
                raise Transient(f"long body (over {n} bytes)")
            if code in _FINAL_ERRORS:
                raise StorageError(f"libcurl error {code}: {msg}")
            if code in _CONNECT_ERRORS:
                raise Unreachable(f"libcurl error {code}: {msg}")
            raise Transient(f"libcurl error {code}: {msg}")
        return resp

    def _release(self, c: Any, resp: Response) -> None:
        # The response's callbacks reference it (and through it `dest`): drop them now.
        c.setopt(pycurl.WRITEFUNCTION, _ignore)
        if resp.dest is not None or resp.headers is not None:
            c.unsetopt(pycurl.HEADERFUNCTION)  # headers discarded in C, not by a callback
        if self._closed:
            c.close()
        else:
            self._free.append(c)

    # -- libcurl's callbacks, on the event loop ---------------------------------------------

    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        self._watch.set(fd, what)  # (`curlwatch`: an idle connection's socket stays cheap)

    def _on_timer(self, ms: int) -> None:
        """libcurl's next timeout. A timer already due sooner is kept: waking libcurl early
        costs one empty `socket_action`, re-arming on every added transfer costs more."""
        if ms < 0:
            return
        due = self._loop.time() + ms / 1e3
        timer = self._timer
        if timer is not None:
            if self._due <= due:
                return
            timer.cancel()
        # libcurl must not be re-entered from its own callback: scheduled, never called here
        self._due = due
        self._timer = self._loop.call_at(due, self._act, pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, events: int) -> None:
        if fd == pycurl.SOCKET_TIMEOUT:
            self._timer = None
        multi = self._multi
        multi.socket_action(fd, events)
        while True:
            queued, ok, failed = multi.info_read()
            for c in ok:
                self._done(c, None)
            for c, code, msg in failed:
                self._done(c, (code, msg))
            if not queued:
                break

    def _done(self, c: Any, err: tuple[int, str] | None) -> None:
        entry = self._running.pop(c, None)
        if entry is None:
            return
        self._multi.remove_handle(c)
        fut = entry[0]
        if not fut.done():
            fut.set_result(err)

    async def aclose(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for c, (fut, _) in list(self._running.items()):
            self._multi.remove_handle(c)
            fut.cancel()
        self._running.clear()
        self._multi.close()  # closes the cached connections
        for c in self._free:
            c.close()
        self._free.clear()
        self._watch.close()  # after the multi: closing it lets go of every socket


def _ignore(data: bytes) -> None:
    return None
