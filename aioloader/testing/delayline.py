"""The delay line: an asyncio TCP proxy that delays, throttles and faults HTTP requests.

This kernel has no netem, so latency, jitter, a bandwidth cap and faults in front of the local
bucket come from this proxy, on its own thread and event loop (:class:`_DelayLine`). Every
client→server chunk waits ``latency + jitter`` in an order-preserving queue per connection, so
each request costs at least one ``latency``; responses stream straight back, optionally
token-bucket capped per connection. Bytes are forwarded unchanged, so keep-alive passes
through; the proxy only tracks request boundaries (request line, headers, ``Content-Length``
body) in the client→server direction, which lets it count requests and, on demand, answer a
seeded fraction of them itself with 503/429, reset their connection (RST, nothing written),
swallow them (a bucket that stops answering), hold the body of their response for a while after
its head (the slow-body tail), or hold a download's response before its head or mid-body for a
while or until the client leaves (a stalled request). A connection whose bytes do not look like
HTTP/1.x (TLS, chunked request bodies, huge headers) falls back to plain forwarding. Faulted
replies and resets happen without waiting for upstream responses, and a slowed response is the
first one to come back after its request went upstream: both are exact for clients that do not
pipeline requests (aiohttp, urllib, requests, http.client).

For benchmarks, :class:`_DelayLineProcess` runs the same delay line in a child process: in a
thread it shares the GIL with the client it measures (at 30 ms and 256 in flight that cost gcsfs
~1/3 of its request rate and ~60% more CPU per request). The child runs this file as a script
(``python -I``), so this module imports the standard library only — nothing from the package.
That makes it the leaf of :mod:`aioloader.testing`: :mod:`.server` takes the shared host,
timeouts and log helper from here, and its ``atexit`` guard stops the live delay lines
(:data:`_LIVE_PROXIES`) before the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

_HOST = "127.0.0.1"
_READY_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_MAX_HEAD = 64 * 1024  # request heads larger than this switch a connection to passthrough
_READ_SIZE = 256 * 1024
_REASONS = {429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
            503: "Service Unavailable", 504: "Gateway Timeout"}


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-limit:].strip() or "(log is empty)"


_LIVE_PROXIES: set[_DelayLine | _DelayLineProcess] = set()  # stopped by server's atexit guard


@dataclasses.dataclass(frozen=True)
class ProxyStats:
    """Counters of the delay line since it started (a snapshot)."""

    connections: int = 0
    requests: int = 0  # HTTP requests seen (request heads parsed), faulted ones included
    downloads: int = 0  # those of them that ask for object bytes (``alt=media``): range reads
    faults: int = 0  # requests answered by the proxy with an error status
    stalled: int = 0  # requests swallowed while stalling
    resets: int = 0  # requests whose connection the proxy reset instead of answering
    slowed: int = 0  # responses whose body the proxy held back after forwarding the head
    cut: int = 0  # responses cut off mid-body (head and part of the body, then RST)
    held: int = 0  # downloads whose response was held (stalled) before its head or mid-body
    bytes_up: int = 0  # client → server bytes forwarded
    bytes_down: int = 0  # server → client bytes forwarded
    passthrough: int = 0  # connections that stopped parsing HTTP (non-HTTP or chunked body)


@dataclasses.dataclass(frozen=True)
class _Faults:
    error_rate: float = 0.0
    statuses: tuple[int, ...] = (503, 429)
    stall: bool = False
    reset_rate: float = 0.0  # fraction of requests whose connection is reset (RST)
    slow_rate: float = 0.0  # fraction of responses whose body is held for slow_s
    slow_s: float = 1.0
    cut_rate: float = 0.0  # fraction of responses cut off after part of their body
    hold_s: float = 0.0  # how long a held response waits (math.inf: until the client leaves)
    hold_at: str = "head"  # "head": before the response head; "body": after part of the body
    hold_rate: float = 0.0  # fraction of downloads (range GETs) whose response is held
    hold_first: int = 0  # the first k downloads after these faults were set are held
    error_first: int = 0  # the first k downloads after these faults were set get an error status
    reset_first: int = 0  # the first k downloads after these faults were set are reset
    error_body: str = ""  # the body of the proxy's error replies (empty: none)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _Faults:
        return cls(**{**d, "statuses": tuple(d["statuses"])})


class _Conn:
    """Request-boundary tracking of one client→server byte stream."""

    __slots__ = ("body_left", "buf", "dropping", "mode")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.body_left = 0
        self.dropping = False  # the current request was answered by the proxy: drop its body
        self.mode = "http"  # "http" | "passthrough" | "stalled" | "reset"


class _Down:
    """Server→client state of one connection: the hold for the next response's body."""

    __slots__ = ("closed", "cut", "head", "hold_s", "slow_s")

    def __init__(self) -> None:
        self.slow_s = 0.0  # > 0: hold the body of the next response this long after its head
        self.hold_s = 0.0  # > 0: hold the next response this long after part of its body
        self.cut = False  # cut the next response off mid-body instead
        self.head = bytearray()  # that response's head, while it is still incomplete
        self.closed = asyncio.Event()  # the client has gone: a hold ends at once

    def head_end(self, data: bytes) -> int | None:
        """Add `data` to the held response; where its head ends once it is all there (or
        too long to be one), else None."""
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0 and len(self.head) <= _MAX_HEAD:
            return None
        return end + 4 if end >= 0 else len(self.head)

    async def hold(self, seconds: float) -> bool:
        """Wait `seconds` (inf: forever) or until the client leaves; True if it is still there."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closed.wait(), None if math.isinf(seconds) else seconds)
        return not self.closed.is_set()


class _DelayLine:
    """Asyncio TCP proxy on a background thread: delay, jitter, bandwidth cap, HTTP faults."""

    def __init__(
        self,
        upstream_port: int,
        latency_s: float,
        jitter_s: float,
        bandwidth: float | None,
        faults: _Faults,
        seed: int,
    ) -> None:
        self.upstream_port = upstream_port
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.bandwidth = bandwidth
        self._hold_left = 0  # of faults.hold_first, the downloads still to hold
        self._error_left = 0  # of faults.error_first, the downloads still to answer with an error
        self._reset_left = 0  # of faults.reset_first, the downloads still to reset
        self.faults = faults  # replaced whole (never mutated) from any thread
        self._rng = random.Random(seed)  # used on the proxy loop only
        self._counts = {f.name: 0 for f in dataclasses.fields(ProxyStats)}
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def faults(self) -> _Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: _Faults) -> None:
        self._faults = faults
        self._hold_left = faults.hold_first
        self._error_left = faults.error_first
        self._reset_left = faults.reset_first

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(**self._counts)

    # -- lifecycle (caller's thread) ---------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="aioloader-delay-line", daemon=True)
        self._thread.start()
        self._ready.wait(_READY_TIMEOUT_S)
        if self._error is not None or not self.port:
            self.stop()
            raise RuntimeError(f"delay-line proxy failed to start: {self._error!r}")
        _LIVE_PROXIES.add(self)

    def stop(self) -> None:
        loop, stop_event, thread = self._loop, self._stop_event, self._thread
        if loop is not None and stop_event is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(stop_event.set)
        if thread is not None:
            thread.join(_STOP_TIMEOUT_S * 2)
            if thread.is_alive():
                raise RuntimeError("delay-line proxy thread did not stop")
        self._thread = None
        _LIVE_PROXIES.discard(self)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        # A deep accept backlog: clients open hundreds of connections at once, and with the
        # default (100) the kernel drops SYNs, each costing the client a 1 s retransmit.
        server = await asyncio.start_server(self._accept, _HOST, 0, limit=_READ_SIZE * 4,
                                            backlog=4096)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    # -- one connection (proxy loop) ---------------------------------------------------------

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._counts["connections"] += 1
        try:
            await self._serve(c_reader, c_writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a peer went away, or proxy shutdown (3.11's stream callback frowns on cancel)
        finally:
            self._tasks.discard(task)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        s_writer: asyncio.StreamWriter | None = None
        try:
            s_reader, s_writer = await asyncio.open_connection(
                _HOST, self.upstream_port, limit=_READ_SIZE * 4
            )
            queue: asyncio.Queue[tuple[float, list[tuple[str, bytes]]] | None] = asyncio.Queue()
            down = _Down()
            pumps = [
                asyncio.create_task(self._client_to_queue(c_reader, queue, down)),
                asyncio.create_task(self._queue_to_server(queue, s_writer, c_writer, down)),
                asyncio.create_task(self._server_to_client(s_reader, c_writer, down)),
            ]
            try:
                # The connection ends when the server side ends, or when the client has left
                # and everything it sent has been delivered.
                await asyncio.wait(pumps[1:], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            for w in (c_writer, s_writer):
                if w is not None:
                    w.close()
            for w in (c_writer, s_writer):
                if w is not None:
                    with contextlib.suppress(OSError):
                        await w.wait_closed()

    async def _client_to_queue(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, list[tuple[str, bytes]]] | None],
        down: _Down,
    ) -> None:
        loop = asyncio.get_running_loop()
        conn = _Conn()
        try:
            while data := await reader.read(_READ_SIZE):
                actions = self._parse(conn, data)
                if actions:
                    delay = self.latency_s
                    if self.jitter_s > 0:
                        delay += self._rng.expovariate(1.0 / self.jitter_s)
                    queue.put_nowait((loop.time() + delay, actions))
        except OSError:
            pass
        finally:
            down.closed.set()
            queue.put_nowait(None)

    async def _queue_to_server(
        self,
        queue: asyncio.Queue[tuple[float, list[tuple[str, bytes]]] | None],
        s_writer: asyncio.StreamWriter,
        c_writer: asyncio.StreamWriter,
        down: _Down,
    ) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            release, actions = item
            if (wait := release - loop.time()) > 0:
                await asyncio.sleep(wait)
            for kind, data in actions:
                if kind == "up":
                    s_writer.write(data)
                    await s_writer.drain()
                    self._counts["bytes_up"] += len(data)
                elif kind == "reply":  # the proxy answers this request itself
                    c_writer.write(data)
                    await c_writer.drain()
                elif kind == "slow":  # the next response (to the request that follows) is slow
                    down.slow_s = float(data.decode())
                    down.head = bytearray()
                elif kind == "cut":  # the next response is cut off mid-body
                    down.cut = True
                    down.head = bytearray()
                elif kind == "hold":  # hold this request's response: before its head, or later
                    where, _, seconds = data.decode().partition(":")
                    if where == "body":
                        down.hold_s = float(seconds)
                        down.head = bytearray()
                        continue
                    self._counts["held"] += 1
                    if not await down.hold(float(seconds)):
                        return  # the client gave up waiting: nothing more to deliver
                else:  # "reset": drop the connection with an RST, nothing written
                    self._counts["resets"] += 1
                    _reset(c_writer)
                    return
        if s_writer.can_write_eof():
            with contextlib.suppress(OSError):
                s_writer.write_eof()
        # The server side decides when the connection ends (it closes on our half-close);
        # give up on it after a while, since the client has already gone.
        await asyncio.sleep(_STOP_TIMEOUT_S)

    async def _server_to_client(
        self, reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter, down: _Down
    ) -> None:
        loop = asyncio.get_running_loop()
        rate = self.bandwidth
        free_at = loop.time()  # token bucket: when the link is free again
        while data := await reader.read(_READ_SIZE if rate is None else min(_READ_SIZE, 64 * 1024)):
            if down.cut:
                # Cut off: the response head and half the body bytes at hand, then an RST.
                if (cut := down.head_end(data)) is None:
                    continue  # wait for the rest of the head
                cut += (len(down.head) - cut) // 2
                c_writer.write(bytes(down.head[:cut]))
                await c_writer.drain()
                self._counts["bytes_down"] += cut
                self._counts["cut"] += 1
                _reset(c_writer)
                return
            if down.hold_s > 0:
                # A stall mid-body: the head and half the body bytes at hand, then nothing.
                if (cut := down.head_end(data)) is None:
                    continue  # wait for the rest of the head
                cut += (len(down.head) - cut) // 2
                data, hold = bytes(down.head[cut:]), down.hold_s
                c_writer.write(bytes(down.head[:cut]))
                down.hold_s, down.head = 0.0, bytearray()
                await c_writer.drain()
                self._counts["bytes_down"] += cut
                self._counts["held"] += 1
                if not await down.hold(hold):
                    return
                if not data:
                    continue
            if down.slow_s > 0:
                # The slow-body tail: forward the response head, then hold the body.
                if (cut := down.head_end(data)) is None:
                    continue  # wait for the rest of the head
                head, data = bytes(down.head[:cut]), bytes(down.head[cut:])
                hold, down.slow_s, down.head = down.slow_s, 0.0, bytearray()
                c_writer.write(head)
                await c_writer.drain()
                self._counts["bytes_down"] += len(head)
                self._counts["slowed"] += 1
                await asyncio.sleep(hold)
                if not data:
                    continue
            if rate is not None:
                free_at = max(free_at, loop.time()) + len(data) / rate
                if (wait := free_at - loop.time()) > 0:
                    await asyncio.sleep(wait)
            c_writer.write(data)
            await c_writer.drain()
            self._counts["bytes_down"] += len(data)

    def _parse(self, conn: _Conn, data: bytes) -> list[tuple[str, bytes]]:
        """Split ``data`` at request boundaries into forward/reply actions, deciding faults."""
        if conn.mode == "passthrough":
            return [("up", data)]
        if conn.mode in ("stalled", "reset"):
            return []
        actions: list[tuple[str, bytes]] = []
        buf = conn.buf
        buf += data
        pos = 0
        while pos < len(buf):
            if conn.body_left:
                n = min(conn.body_left, len(buf) - pos)
                if not conn.dropping:
                    actions.append(("up", bytes(buf[pos : pos + n])))
                conn.body_left -= n
                pos += n
                continue
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                if len(buf) - pos > _MAX_HEAD or not _looks_like_http(buf[pos : pos + 16]):
                    return self._to_passthrough(conn, actions, pos)
                break  # wait for the rest of the head
            head = bytes(buf[pos : end + 4])
            body = _body_length(head)
            if body is None:
                return self._to_passthrough(conn, actions, pos)
            self._counts["requests"] += 1
            download = b"alt=media" in head[: head.find(b"\r\n")]
            if download:
                self._counts["downloads"] += 1
            faults = self.faults
            if faults.stall:
                self._counts["stalled"] += 1
                conn.mode = "stalled"
                conn.buf = bytearray()
                return actions
            if self._first(download, "_reset_left") or (
                    faults.reset_rate > 0 and self._rng.random() < faults.reset_rate):
                conn.mode = "reset"  # counted when the reset happens, after the latency
                conn.buf = bytearray()
                actions.append(("reset", b""))
                return _coalesce(actions)
            pos = end + 4
            conn.body_left = body
            conn.dropping = self._first(download, "_error_left") or (
                faults.error_rate > 0 and self._rng.random() < faults.error_rate)
            if conn.dropping:
                self._counts["faults"] += 1
                actions.append(("reply", _error_reply(self._rng.choice(faults.statuses),
                                                      faults.error_body)))
            else:
                if download and self._holds(faults):
                    actions.append(("hold", f"{faults.hold_at}:{faults.hold_s!r}".encode()))
                elif faults.slow_rate > 0 and self._rng.random() < faults.slow_rate:
                    actions.append(("slow", repr(faults.slow_s).encode()))
                elif faults.cut_rate > 0 and self._rng.random() < faults.cut_rate:
                    actions.append(("cut", b""))
                actions.append(("up", head))
        del buf[:pos]
        return _coalesce(actions)

    def _first(self, download: bool, left: str) -> bool:
        """Whether this request is one of the first k downloads to fault (`left`: the counter
        of those still to come)."""
        if not download or getattr(self, left) <= 0:
            return False
        setattr(self, left, getattr(self, left) - 1)
        return True

    def _holds(self, faults: _Faults) -> bool:
        """Whether this download's response is held (the first k, then a seeded fraction)."""
        if self._hold_left > 0:
            self._hold_left -= 1
            return True
        return faults.hold_rate > 0 and self._rng.random() < faults.hold_rate

    def _to_passthrough(
        self, conn: _Conn, actions: list[tuple[str, bytes]], pos: int
    ) -> list[tuple[str, bytes]]:
        self._counts["passthrough"] += 1
        conn.mode = "passthrough"
        actions.append(("up", bytes(conn.buf[pos:])))
        conn.buf = bytearray()
        return _coalesce(actions)


class _DelayLineProcess:
    """The delay line in a child process (``proxy_process=True``), driven over its stdin/stdout.

    The child runs this very file with ``python -I`` (stdlib only, no package import) and
    exits when its stdin closes, so it cannot outlive the parent.
    """

    def __init__(
        self, upstream_port: int, latency_s: float, jitter_s: float, bandwidth: float | None,
        faults: _Faults, seed: int, log_path: Path,
    ) -> None:
        self._config = {
            "upstream_port": upstream_port, "latency_s": latency_s, "jitter_s": jitter_s,
            "bandwidth": bandwidth, "seed": seed, "faults": dataclasses.asdict(faults),
        }
        self._faults = faults
        self._log_path = log_path
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> None:
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", __file__, "--delay-line", json.dumps(self._config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
            )
        _LIVE_PROXIES.add(self)
        try:
            self.port = int(self._call(None)["port"])
        except BaseException:
            self.stop()
            raise

    def _call(self, msg: dict[str, Any] | None) -> dict[str, Any]:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None or proc.stdout is None:
                raise RuntimeError("delay-line process is not running")
            try:
                if msg is not None:
                    proc.stdin.write(json.dumps(msg) + "\n")
                    proc.stdin.flush()
                line = proc.stdout.readline()
            except OSError:
                line = ""
            if not line:
                raise RuntimeError(
                    f"delay-line process died; log {self._log_path}:\n{_log_tail(self._log_path)}"
                )
            return json.loads(line)

    @property
    def faults(self) -> _Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: _Faults) -> None:
        self._call({"op": "faults", **dataclasses.asdict(faults)})
        self._faults = faults

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(**self._call({"op": "stats"}))

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_STOP_TIMEOUT_S)
            if proc.stdout is not None:
                proc.stdout.close()
        _LIVE_PROXIES.discard(self)


def _delay_line_main(config_json: str) -> None:
    """Child side of :class:`_DelayLineProcess`: serve until stdin closes."""
    cfg = json.loads(config_json)
    faults = _Faults.from_dict(cfg.pop("faults"))
    try:  # uvloop when installed: it stands in for the network, its CPU is not the client's
        import uvloop
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    line = _DelayLine(**cfg, faults=faults)
    line.start()
    try:
        print(json.dumps({"port": line.port}), flush=True)
        for raw in sys.stdin:
            msg = json.loads(raw)
            if msg.pop("op") == "faults":
                line.faults = _Faults.from_dict(msg)
                print("{}", flush=True)
            else:
                print(json.dumps(dataclasses.asdict(line.stats)), flush=True)
    finally:
        line.stop()


_METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"PATCH ", b"OPTIONS ")


def _looks_like_http(prefix: bytes | bytearray) -> bool:
    prefix = bytes(prefix)
    return any(m.startswith(prefix[: len(m)]) for m in _METHODS)


def _body_length(head: bytes) -> int | None:
    """The request body length, or None when the request is not plain HTTP/1.x we can frame."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not _looks_like_http(lines[0]):
        return None
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
        elif name == b"transfer-encoding" and value.strip().lower() != b"identity":
            return None  # chunked bodies: not framed here, forward the rest untouched
        elif name == b"expect":
            return None  # 100-continue would need the server's interim answer
    return length if length >= 0 else None


def _error_reply(status: int, body: str = "") -> bytes:
    reason = _REASONS.get(status, "Error")
    data = body.encode()
    kind = "Content-Type: application/json; charset=UTF-8\r\n" if data[:1] == b"{" else ""
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(data)}\r\n{kind}"
        f"Connection: keep-alive\r\nRetry-After: 0\r\n\r\n"
    ).encode() + data


def _coalesce(actions: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for kind, data in actions:
        if out and kind == "up" and out[-1][0] == "up":
            out[-1] = ("up", out[-1][1] + data)
        elif data or kind in ("reset", "cut"):
            out.append((kind, data))
    return out


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection abruptly: SO_LINGER 0 makes the close an RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


if __name__ == "__main__" and sys.argv[1:2] == ["--delay-line"]:
    with contextlib.suppress(KeyboardInterrupt):
        _delay_line_main(sys.argv[2])
