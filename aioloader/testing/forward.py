"""The delay line's forwarding of one connection: three pumps between the client and the
bucket, and the server→client side of the faults.

Every client→server chunk waits ``latency + jitter`` in an order-preserving queue per
connection, so each request costs at least one ``latency``; responses stream straight back,
optionally token-bucket capped per connection. Bytes are forwarded unchanged, so keep-alive
passes through. A faulted reply or reset happens without waiting for upstream responses, and a
slowed, cut or held response is the first one to come back after its request went upstream:
both are exact for clients that do not pipeline requests (aiohttp, urllib, requests,
http.client). `_Forwarder` is the base of `_DelayLine`, which adds the thread, loop and server
that accept the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import socket
import struct

from .faults import _MAX_HEAD, Actions, ProxyStats, _Conn, _Faults, _Requests

_HOST = "127.0.0.1"
_STOP_TIMEOUT_S = 5.0
_READ_SIZE = 256 * 1024
_Queue = asyncio.Queue[tuple[float, Actions] | None]  # (release time, actions); None: the end


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

    def split(self, data: bytes, mid_body: bool) -> tuple[bytes, bytes] | None:
        """Add `data` to the held response; once its head is all there, (what to send now,
        the rest): the head, and with `mid_body` half the body bytes at hand too. None while
        the head is incomplete."""
        if (cut := self.head_end(data)) is None:
            return None
        if mid_body:
            cut += (len(self.head) - cut) // 2
        parts = bytes(self.head[:cut]), bytes(self.head[cut:])
        self.head = bytearray()
        return parts

    async def hold(self, seconds: float) -> bool:
        """Wait `seconds` (inf: forever) or until the client leaves; True if it is still there."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.closed.wait(), None if math.isinf(seconds) else seconds)
        return not self.closed.is_set()


class _Forwarder:
    """What forwarding needs across connections (the link's settings, the seeded draws and the
    counters), and the pumps of one connection."""

    def __init__(self, upstream_port: int, latency_s: float, jitter_s: float,
                 bandwidth: float | None, faults: _Faults, seed: int) -> None:
        self.upstream_port = upstream_port
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.bandwidth = bandwidth
        self._rng = random.Random(seed)  # used on the proxy loop only
        self._counts = {f.name: 0 for f in dataclasses.fields(ProxyStats)}
        self._requests = _Requests(faults, self._rng, self._counts)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        s_writer: asyncio.StreamWriter | None = None
        try:
            s_reader, s_writer = await asyncio.open_connection(
                _HOST, self.upstream_port, limit=_READ_SIZE * 4
            )
            queue: _Queue = asyncio.Queue()
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
        queue: _Queue,
        down: _Down,
    ) -> None:
        loop = asyncio.get_running_loop()
        conn = _Conn()
        try:
            while data := await reader.read(_READ_SIZE):
                actions = self._requests.parse(conn, data)
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
        queue: _Queue,
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
                if (parts := down.split(data, mid_body=True)) is None:
                    continue  # wait for the rest of the head
                await self._send(c_writer, parts[0])
                self._counts["cut"] += 1
                _reset(c_writer)
                return
            if down.hold_s > 0:
                # A stall mid-body: the head and half the body bytes at hand, then nothing.
                if (parts := down.split(data, mid_body=True)) is None:
                    continue
                hold, down.hold_s = down.hold_s, 0.0
                await self._send(c_writer, parts[0])
                self._counts["held"] += 1
                if not await down.hold(hold):
                    return
                if not (data := parts[1]):
                    continue
            if down.slow_s > 0:
                # The slow-body tail: forward the response head, then hold the body.
                if (parts := down.split(data, mid_body=False)) is None:
                    continue
                hold, down.slow_s = down.slow_s, 0.0
                await self._send(c_writer, parts[0])
                self._counts["slowed"] += 1
                await asyncio.sleep(hold)
                if not (data := parts[1]):
                    continue
            if rate is not None:
                free_at = max(free_at, loop.time()) + len(data) / rate
                if (wait := free_at - loop.time()) > 0:
                    await asyncio.sleep(wait)
            await self._send(c_writer, data)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        # counted before it goes: a client that has the bytes finds them counted (counted
        # after `drain`, a snapshot taken right after a read could miss them)
        self._counts["bytes_down"] += len(data)
        writer.write(data)
        await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection abruptly: SO_LINGER 0 makes the close an RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

