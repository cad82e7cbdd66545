"""The delay line's client→server side: where each HTTP request starts and ends, and which
fault the proxy plays on it.

Only request boundaries are tracked (request line, headers, ``Content-Length`` body), enough to
count requests and, on demand, answer a seeded fraction of them with 503/429, reset their
connection, swallow them, or mark their response to be slowed, cut or held on the way back
(:mod:`.forward` plays those). A stream that does not frame as plain HTTP/1.x (TLS, chunked
request bodies, huge headers) switches to passthrough. Standard library only, like the rest of
the delay line (its child process imports no package).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

_MAX_HEAD = 64 * 1024  # request heads larger than this switch a connection to passthrough
_REASONS = {429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
            503: "Service Unavailable", 504: "Gateway Timeout"}
_METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"PATCH ", b"OPTIONS ")

Actions = list[tuple[str, bytes]]  # ("up" | "reply" | "slow" | "cut" | "hold" | "reset", data)


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


class _Requests:
    """The fault decisions over the requests of all connections: the faults in force, the
    seeded draws (the line's generator, shared with its jitter) and the request counters."""

    def __init__(self, faults: _Faults, rng: random.Random, counts: dict[str, int]) -> None:
        self._rng = rng
        self._counts = counts
        self._hold_left = 0  # of faults.hold_first, the downloads still to hold
        self._error_left = 0  # of faults.error_first, the downloads still to answer with an error
        self._reset_left = 0  # of faults.reset_first, the downloads still to reset
        self.faults = faults  # replaced whole (never mutated) from any thread

    @property
    def faults(self) -> _Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: _Faults) -> None:
        self._faults = faults
        self._hold_left = faults.hold_first
        self._error_left = faults.error_first
        self._reset_left = faults.reset_first

    def parse(self, conn: _Conn, data: bytes) -> Actions:
        """Split ``data`` at request boundaries into forward/reply actions, deciding faults."""
        if conn.mode == "passthrough":
            return [("up", data)]
        if conn.mode in ("stalled", "reset"):
            return []
        actions: Actions = []
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

    def _to_passthrough(self, conn: _Conn, actions: Actions, pos: int) -> Actions:
        self._counts["passthrough"] += 1
        conn.mode = "passthrough"
        actions.append(("up", bytes(conn.buf[pos:])))
        conn.buf = bytearray()
        return _coalesce(actions)


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


def _coalesce(actions: Actions) -> Actions:
    out: Actions = []
    for kind, data in actions:
        if out and kind == "up" and out[-1][0] == "up":
            out[-1] = ("up", out[-1][1] + data)
        elif data or kind in ("reset", "cut"):
            out.append((kind, data))
    return out
