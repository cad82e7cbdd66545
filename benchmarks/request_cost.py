"""Client CPU and rate of 1 KiB range GETs, by HTTP client, against local_gcs() at 0 ms.

Usage: PYTHONPATH=. python benchmarks/request_cost.py [reads] [repeats] [clients...]

Clients (issue 15, "cheaper requests"), interleaved within each repeat, 64 and 256 in flight:
  storage-fsspec   Storage.read with gcsfs's own reads (what a record read costs there)
  storage-curl     Storage.read with the libcurl backend (aioloader.io.gcs.backend)
  gcsfsbackend     GcsfsBackend.read (gcsfs's reads, one call, no retry layer)
  curlbackend      CurlGCSBackend.read (one attempt, no retry layer)
  aiohttp-min      a bare aiohttp session: prebuilt URL, one Range header, resp.read()
  curl-min         aioloader.io.gcs.curl.CurlSession.get (libcurl multi on the event loop), bare
  obstore          obstore.get_range_async on a GCSStore (no aioloader code at all)
  obstore-get      obstore.get_async with a range, then bytes_async(): the shape a read
                   pinned to a generation needs (get_range has no version option)
  obstore-stream   obstore.get_async with a range, then its body streamed: the shape a
                   hedged read needs (the head, then each chunk, seen from Python)
  obstore-ranges   obstore.get_ranges_async: OBSTORE_RANGES (8) ranges of the object per call
                   (coalesce=0: one GET each, up to 10 at once inside the call), in flight
                   counted in GETs (64 in flight = 64 / RANGES calls; with over 10
                   ranges a call, fewer GETs are in flight than the column says)
  httpx-h1         httpx.AsyncClient over HTTP/1.1
  httpx-h2         httpx.AsyncClient over HTTP/2 (TLS: fake-gcs-server speaks no h2c)
  pycurl           a CurlMulti loop on a thread (the client alone, no asyncio)

The fake-gcs-server runs in its own process, so process_time() is the client alone (Rust
and curl threads included). The obstore contenders are skipped when obstore is not installed
(a benchmark-only dependency: pip install obstore).
"""
from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from aioloader.io.storage import Storage
from aioloader.io.sync import new_event_loop
from aioloader.testing import local_gcs
from aioloader.testing.server import _executable, _free_port, find_fake_gcs_server

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CLIENTS = sys.argv[3:] or ["storage-fsspec", "storage-curl", "gcsfsbackend",
                           "curlbackend", "aiohttp-min", "curl-min", "obstore",
                           "obstore-get", "obstore-stream", "obstore-ranges",
                           "pycurl"]  # httpx-h1 and -h2: run them alone (see RESULTS.md)
if find_spec("obstore") is None and any(c.startswith("obstore") for c in CLIENTS):
    print("obstore is not installed: its contenders are skipped (pip install obstore)")
    CLIENTS = [c for c in CLIENTS if not c.startswith("obstore")]
RANGES = int(os.environ.get("OBSTORE_RANGES", "8"))  # ranges per get_ranges call
SIZE = 8 << 20
NAME = "cpu.bin"


async def drive(read, offsets: list[int], k: int) -> tuple[float, float]:
    """(µs CPU per GET, GET/s) of `read(off)` over `offsets`, `k` in flight."""
    it = iter(offsets)

    async def worker() -> None:
        for off in it:
            data = await read(off)
            assert len(data) == 1024, len(data)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(k)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / len(offsets) * 1e6, len(offsets) / wall


async def drive_many(read_many, offsets: list[int], k: int) -> tuple[float, float]:
    """`drive` for a reader of RANGES offsets per call: k // RANGES calls in flight."""
    groups = iter([offsets[i:i + RANGES] for i in range(0, len(offsets), RANGES)])

    async def worker() -> None:
        for group in groups:
            got = await read_many(group)
            assert [len(d) for d in got] == [1024] * len(group)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, k // RANGES))))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / len(offsets) * 1e6, len(offsets) / wall


def curl_drive(url: str, offsets: list[int], k: int) -> tuple[float, float]:
    import pycurl

    multi = pycurl.CurlMulti()
    free = [pycurl.Curl() for _ in range(k)]
    bufs: dict = {}
    todo = list(offsets)
    done = 0

    def start(c, off):
        chunks: list[bytes] = []
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.RANGE, f"{off}-{off + 1023}")
        c.setopt(pycurl.WRITEFUNCTION, chunks.append)
        bufs[c] = chunks
        multi.add_handle(c)

    cpu, wall = time.process_time(), time.perf_counter()
    while todo and free:
        start(free.pop(), todo.pop())
    while done < len(offsets):
        multi.select(1.0)
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        _, ok, bad = multi.info_read()
        assert not bad, bad
        for c in ok:
            assert len(b"".join(bufs.pop(c))) == 1024
            multi.remove_handle(c)
            done += 1
            if todo:
                start(c, todo.pop())
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / len(offsets) * 1e6, len(offsets) / wall


class TLSServer:
    """A second fake-gcs-server over https (Go then offers h2 by ALPN), for httpx-h2."""

    def __enter__(self) -> TLSServer:
        import tempfile
        tmp = Path(tempfile.mkdtemp())
        self.port = _free_port()
        addr = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(_executable(find_fake_gcs_server(), tmp)), "-scheme", "https", "-host",
             "127.0.0.1", "-port", str(self.port), "-backend", "memory", "-log-level", "error",
             "-external-url", f"https://{addr}", "-public-host", addr],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"https://{addr}"
        import httpx
        for _ in range(200):
            try:
                httpx.get(self.endpoint + "/storage/v1/b", verify=False)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        httpx.post(self.endpoint + "/storage/v1/b?project=t", json={"name": "bench"},
                   verify=False).raise_for_status()
        return self

    def upload(self, data: bytes) -> str:
        import httpx
        httpx.post(f"{self.endpoint}/upload/storage/v1/b/bench/o?uploadType=media&name={NAME}",
                   content=data, verify=False).raise_for_status()
        return f"{self.endpoint}/bench/{NAME}"

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()


errors: dict = {}


async def measure(gcs, tls_url: str | None, offsets: list[int], results: dict) -> None:
    import aiohttp
    url = gcs.url(NAME)
    http_url = f"{gcs.endpoint}/{gcs.bucket}/{NAME}"
    opened: list = []
    closers: list = []

    def storage(client: str) -> Storage:
        s = Storage(concurrency=256, storage_options=gcs.storage_options, gcs_client=client)
        opened.append(s)
        return s

    readers: dict[str, Any] = {}
    if "storage-fsspec" in CLIENTS:
        s = storage("fsspec")
        readers["storage-fsspec"] = lambda off, s=s: s.read(url, off, off + 1024)
    if "storage-curl" in CLIENTS:
        s = storage("curl")
        readers["storage-curl"] = lambda off, s=s: s.read(url, off, off + 1024)
    if "gcsfsbackend" in CLIENTS:
        b, p = storage("fsspec").stores.route(url)
        readers["gcsfsbackend"] = lambda off, b=b, p=p: b.read(p, off, off + 1024)
    if "curlbackend" in CLIENTS:
        b, p = storage("curl").stores.route(url)
        readers["curlbackend"] = lambda off, b=b, p=p: b.read(p, off, off + 1024)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    auto_decompress=False)
    if "aiohttp-min" in CLIENTS:
        import yarl
        min_url = yarl.URL(http_url)

        async def aiohttp_min(off: int) -> bytes:
            async with session.get(min_url, headers={"Range": f"bytes={off}-{off + 1023}"}) as r:
                return await r.read()
        readers["aiohttp-min"] = aiohttp_min
    if "curl-min" in CLIENTS:
        from aioloader.io.gcs.curl import CurlSession
        cs = CurlSession(256)
        closers.append(cs)

        async def curl_min(off: int) -> bytes:
            r = await cs.get(http_url, off, off + 1024, [])
            return r.body
        readers["curl-min"] = curl_min
    many: dict[str, Any] = {}
    if any(c.startswith("obstore") for c in CLIENTS):
        import obstore
        from obstore.store import GCSStore

        # the emulator's XML-API path (/bucket/object), anonymous, over http
        st = GCSStore(gcs.bucket, base_url=gcs.endpoint, skip_signature=True,
                      client_options={"allow_http": True, "pool_max_idle_per_host": "1024"})
    if "obstore" in CLIENTS:
        readers["obstore"] = lambda off: obstore.get_range_async(st, NAME, start=off,
                                                                 end=off + 1024)
    if "obstore-get" in CLIENTS:
        async def obstore_get(off: int) -> Any:  # (obstore.Bytes)
            r = await obstore.get_async(st, NAME, options={"range": (off, off + 1024)})
            return await r.bytes_async()
        readers["obstore-get"] = obstore_get
    if "obstore-stream" in CLIENTS:
        async def obstore_stream(off: int) -> bytes:
            r = await obstore.get_async(st, NAME, options={"range": (off, off + 1024)})
            chunks = [bytes(c) async for c in r.stream(min_chunk_size=0)]
            return b"".join(chunks)
        readers["obstore-stream"] = obstore_stream
    if "obstore-ranges" in CLIENTS:
        async def obstore_ranges(offs: list[int]) -> list:
            return await obstore.get_ranges_async(st, NAME, starts=offs,
                                                  lengths=[1024] * len(offs), coalesce=0)
        many["obstore-ranges"] = obstore_ranges
    clients = []
    for name, h2, u in (("httpx-h1", False, http_url), ("httpx-h2", True, tls_url)):
        if name in CLIENTS and u:
            import httpx
            c = httpx.AsyncClient(http2=h2, verify=False,
                                  limits=httpx.Limits(max_connections=None,
                                                      max_keepalive_connections=None))
            clients.append(c)

            async def get(off: int, c=c, u=u) -> bytes:
                r = await c.get(u, headers={"Range": f"bytes={off}-{off + 1023}"})
                return r.content
            readers[name] = get
    try:
        for read in readers.values():  # warm: connections, imports
            await drive(read, offsets[:2000], 256)
        for read_many in many.values():
            await drive_many(read_many, offsets[:2000], 256)
        for rep in range(REPEATS):
            for k in (64, 256):
                names = (list(readers) + list(many)
                         + (["pycurl"] if "pycurl" in CLIENTS else []))
                for name in (names if rep % 2 == 0 else names[::-1]):  # ABBA
                    try:
                        if name == "pycurl":
                            r = await asyncio.to_thread(curl_drive, http_url, offsets, k)
                        elif name in many:
                            r = await drive_many(many[name], offsets, k)
                        else:
                            r = await drive(readers[name], offsets, k)
                    except Exception as exc:  # a client that fails here is reported, not fatal
                        errors[(name, k)] = f"{type(exc).__name__}: {exc}"[:80]
                        continue
                    results.setdefault((name, k), []).append(r)
    finally:
        await session.close()
        for c in clients:
            await c.aclose()
        for s in opened + closers:
            await s.aclose()


def main() -> None:
    rng = random.Random(0)
    offsets = [rng.randrange(0, SIZE - 1024) for _ in range(N)]
    data = os.urandom(SIZE)
    results: dict = {}
    with local_gcs() as gcs:
        gcs.upload_bytes(data, NAME)
        import contextlib
        with (TLSServer() if "httpx-h2" in CLIENTS else contextlib.nullcontext()) as tls:
            tls_url = tls.upload(data) if tls else None
            loop = new_event_loop()
            try:
                loop.run_until_complete(measure(gcs, tls_url, offsets, results))
            finally:
                loop.close()
    print(f"{N} x 1 KiB range GETs per run, {REPEATS} runs, {type(loop).__module__} loop, "
          f"{threading.active_count()} threads")
    ref = CLIENTS[0]
    print(f"{'client':18} {'in flight':>9} {'µs CPU/GET (median, range)':>30} "
          f"{'GET/s (median, range)':>26}   CPU, GET/s ÷ {ref}'s in the same repeat "
          "(median, range)")
    for (name, k), runs in results.items():
        cpu = [c for c, _ in runs]
        rate = [r for _, r in runs]
        base = results.get((ref, k), [])
        rc = [c / b for (c, _), (b, _) in zip(runs, base)]
        rr = [r / b for (_, r), (_, b) in zip(runs, base)]
        ratios = (f"   {statistics.median(rc):.2f}× ({min(rc):.2f}-{max(rc):.2f}), "
                  f"{statistics.median(rr):.2f}× ({min(rr):.2f}-{max(rr):.2f})"
                  if rc and name != ref else "")
        print(f"{name:18} {k:>9} {statistics.median(cpu):>12.0f} ({min(cpu):.0f}-{max(cpu):.0f})"
              f"{statistics.median(rate):>16,.0f} ({min(rate):,.0f}-{max(rate):,.0f})"
              + ratios)
    for (name, k), err in errors.items():
        print(f"{name:18} {k:>9} failed (some runs): {err}")


if __name__ == "__main__":
    main()
