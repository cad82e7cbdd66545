"""A separate process for tests/cache/test_disk_cache.py: fill a shared disk cache from the bucket
(`fill`), or run the loader over it (`load`); prints one JSON line of what it did."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aioloader as al
from aioloader.cache.disk import DiskCache
from aioloader.cache.tier import DiskTier

from . import pipeline_fns as fns


async def fill(urls, opts, cache_dir, segment, start_at):
    async with al.ArrayRecordSource(urls, storage_options=opts) as src:
        tier = DiskTier(DiskCache(cache_dir, 1 << 30), src.table, src.storage, segment)
        while time.time() < start_at:  # both processes begin together
            await asyncio.sleep(0.001)
        tier.start_filler(4, now=True)
        while not tier.filled:
            await asyncio.sleep(0.01)
        out = {"downloads": tier.downloads, "segments": len(tier),
               "on_disk": int(tier.have.sum())}
        await tier.aclose()
        return out


def pipeline(paths, opts):
    return (al.Dataset.from_arrayrecord(paths, storage_options=opts).shuffle(5)
            .map(fns.decode).map(fns.just_id).batch(64))


async def load(urls, opts, cache_dir, segment):
    async with pipeline(urls, opts).loader(workers=1, memory_budget=4 * segment,
                                           resident_bytes=0, cache_dir=cache_dir) as it:
        ids = [int(i) for b in [b async for b in it] for i in b]
        cache = it.stats().as_dict()["cache"]
    return {"ids": ids, "cache": cache}


if __name__ == "__main__":
    what, args = sys.argv[1], json.loads(sys.argv[2])
    fn = {"fill": fill, "load": load}[what]
    print(json.dumps(asyncio.run(fn(**args))))
