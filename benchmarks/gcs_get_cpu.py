"""Client CPU per range GET of the gs:// backend: 1 KiB reads, 64 in flight, local_gcs() at 0 ms.

Usage: PYTHONPATH=. python benchmarks/gcs_get_cpu.py [reads] [repeats]

Runs the backend AIOLOADER_GCS_CLIENT picks (auto: libcurl when pycurl is installed); run it
with AIOLOADER_GCS_CLIENT=fsspec for gcsfs's own reads (benchmarks/request_cost.py compares
them, and other clients, side by side).

The fake-gcs-server runs in its own process, so process_time() is the client alone.
"""
from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time

from aioloader.io.storage import Storage
from aioloader.testing import local_gcs

try:  # newer trees: aioloader.io.sync
    from aioloader.io.sync import new_event_loop
except ImportError:
    from aioloader.aioutil import new_event_loop

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
IN_FLIGHT = 64
SIZE = 8 << 20
BACKEND: list = []


async def run(url: str, opts: dict) -> tuple[list[float], list[float]]:
    storage = Storage(concurrency=IN_FLIGHT, storage_options=opts)
    backend, path = storage.stores.route(url)
    BACKEND[:] = [backend]
    rng = random.Random(0)
    offsets = [rng.randrange(0, SIZE - 1024) for _ in range(N)]

    async def drive(read) -> float:
        it = iter(offsets)

        async def worker() -> None:
            for off in it:
                data = await read(url if read == storage.read else path, off, off + 1024)
                assert len(data) == 1024

        cpu = time.process_time()
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        return (time.process_time() - cpu) / N * 1e6

    try:
        await drive(storage.read)  # warm: connections, imports
        via_storage, via_backend = [], []
        for _ in range(REPEATS):
            via_backend.append(await drive(backend.read))
            via_storage.append(await drive(storage.read))
        return via_backend, via_storage
    finally:
        await storage.aclose()


def main() -> None:
    with local_gcs() as gcs:
        url = gcs.upload_bytes(os.urandom(SIZE), "cpu.bin")
        loop = new_event_loop()
        try:
            backend, storage = loop.run_until_complete(run(url, gcs.storage_options))
        finally:
            loop.close()
    print(f"{N} x 1 KiB range GETs, {IN_FLIGHT} in flight, {type(loop).__module__} loop")
    name = type(BACKEND[0]).__name__
    print(f"  {name}.read : median {statistics.median(backend):.0f} µs CPU/GET  "
          f"(runs {', '.join(f'{x:.0f}' for x in backend)})")
    print(f"  Storage.read    : median {statistics.median(storage):.0f} µs CPU/GET  "
          f"(runs {', '.join(f'{x:.0f}' for x in storage)})")


if __name__ == "__main__":
    main()
