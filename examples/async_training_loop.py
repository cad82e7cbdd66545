"""`async for` in a custom loop: prefetch overlapping a (simulated) restore, then stats.

    python examples/async_training_loop.py [GLOB] [--steps N] [--workers W]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import parse, to_fixed

import aioloader as al


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("glob", nargs="?", default="data/sample/train-*.array_record")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()

    ds = (al.Dataset.from_arrayrecord(args.glob).shuffle(seed=0).repeat()
          .map(parse).map(to_fixed).batch(128, drop_remainder=True))
    it = ds.loader(workers=args.workers, prefetch=4)
    it.start_prefetch()  # files open and the first batches load while we "restore a model"
    await asyncio.sleep(0.2)
    async with it:
        t0 = time.perf_counter()
        step = 0
        async for batch in it:
            rows = len(batch["label"])
            await asyncio.sleep(0.002)  # the training step
            step += 1
            if step == args.steps:
                break
        took = time.perf_counter() - t0
        print(f"{step} steps of {rows} in {took:.2f} s ({step * rows / took:,.0f} records/s)")
        print(it.stats())
        print("resume with:", it.get_state())


if __name__ == "__main__":
    asyncio.run(main())
