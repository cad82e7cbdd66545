"""A restarted job reading a filled disk cache: epoch 1 fills `cache_dir`, then fresh loaders
(with and without the bounded memory tier above the disk tier) read it, each run followed by
the same pipeline on local disk. Rates are taken after the first batch.

    PYTHONPATH=$PWD python benchmarks/disk_restart.py [DATA_DIR]

DATA_DIR: ArrayRecord shards of 1 KiB JSON records (e.g. bench_scale's --quick dataset).
"""

from __future__ import annotations

import asyncio
import glob
import json
import sys
import tempfile
import time

import aioloader as al
from aioloader.testing import local_gcs

DATA = sys.argv[1] if len(sys.argv) > 1 else "/tmp/fleet-data/text-n60000-s20-g1-zstd3-v1"


async def rate(ds: al.Dataset, **kw) -> float:
    n, first = 0, None
    async with ds.loader(workers=2, **kw) as it:
        async for _ in it:
            first = first or time.perf_counter()
            n += 256
    return n / (time.perf_counter() - first)


async def main(paths: list[str], urls: list[str], opts: dict) -> None:
    local = al.Dataset.from_arrayrecord(paths).shuffle(0).map(json.loads).batch(256)
    remote = al.Dataset.from_arrayrecord(urls, storage_options=opts)
    remote = remote.shuffle(0).map(json.loads).batch(256)
    with tempfile.TemporaryDirectory() as cache:
        first = await rate(remote, cache_dir=cache, resident_bytes=8 << 20)  # not whole
        print(f"epoch 1 (fills the cache): {first:,.0f} rec/s")
        await asyncio.sleep(5)  # the filler finishes
        for resident in (8 << 20, 0, 8 << 20, 0):
            r = await rate(remote, cache_dir=cache, resident_bytes=resident)
            lo = await rate(local)
            print(f"resident_bytes {resident >> 20} MiB: from the cache {r:,.0f} rec/s, "
                  f"local {lo:,.0f} rec/s, ratio {r / lo:.2f}")


if __name__ == "__main__":
    files = sorted(glob.glob(f"{DATA}/*"))
    with local_gcs(latency_ms=30, jitter_ms=10, proxy_process=True) as gcs:
        up = [gcs.upload(p, f"s/{p.rsplit('/', 1)[1]}") for p in files]
        asyncio.run(main(files, up, gcs.storage_options))
