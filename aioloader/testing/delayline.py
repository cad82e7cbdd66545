"""The delay line: an asyncio TCP proxy that delays, throttles and faults HTTP requests.

This kernel has no netem, so latency, jitter, a bandwidth cap and faults in front of the local
bucket come from this proxy, on its own thread and event loop (:class:`_DelayLine`). It is
three modules, each owning one side: :mod:`.faults` frames the client's requests and decides
which fault each one meets (503/429, a reset, a stall, a slowed, cut or held response),
:mod:`.forward` forwards one connection (latency queue, bandwidth cap, the response-side
faults), and this module runs the proxy, in a thread or in a child process.

For benchmarks, :class:`_DelayLineProcess` runs the same delay line in a child process: in a
thread it shares the GIL with the client it measures (docs/performance.md has the cost). The
child imports these three modules as a bare package (``python -I``, no ``aioloader`` import),
so they import the standard library only. That makes them the leaves of
:mod:`aioloader.testing`: :mod:`.server` takes the shared host, timeouts and log helper from
here, and its ``atexit`` guard stops the live delay lines (:data:`_LIVE_PROXIES`) before the
servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from .faults import ProxyStats, _Conn, _Faults
from .forward import _HOST, _READ_SIZE, _STOP_TIMEOUT_S, _Forwarder

__all__ = ["_HOST", "_STOP_TIMEOUT_S", "ProxyStats", "_Conn", "_DelayLine", "_DelayLineProcess",
           "_Faults"]

_READY_TIMEOUT_S = 10.0
# The child process: this folder imported as a bare package, so that these stdlib-only modules
# import each other without running the package's __init__ (argv: the folder, the config).
_CHILD = ("import sys, types; pkg = types.ModuleType('aioloader_delay_line'); "
          "pkg.__path__ = [sys.argv[1]]; sys.modules[pkg.__name__] = pkg; "
          "from aioloader_delay_line.delayline import _delay_line_main; "
          "_delay_line_main(sys.argv[2])")


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-limit:].strip() or "(log is empty)"


_LIVE_PROXIES: set[_DelayLine | _DelayLineProcess] = set()  # stopped by server's atexit guard


class _DelayLine(_Forwarder):
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
        super().__init__(upstream_port, latency_s, jitter_s, bandwidth, faults, seed)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def faults(self) -> _Faults:
        return self._requests.faults

    @faults.setter
    def faults(self, faults: _Faults) -> None:  # replaced whole (never mutated), any thread
        self._requests.faults = faults

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




class _DelayLineProcess:
    """The delay line in a child process (``proxy_process=True``), driven over its stdin/stdout.

    The child imports this folder as a bare package with ``python -I`` (stdlib only, no
    package import) and exits when its stdin closes, so it cannot outlive the parent.
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
                [sys.executable, "-I", "-c", _CHILD, str(Path(__file__).parent),
                 json.dumps(self._config)],
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



if __name__ == "__main__" and sys.argv[1:2] == ["--delay-line"]:
    with contextlib.suppress(KeyboardInterrupt):
        _delay_line_main(sys.argv[2])
