"""`aioloader bench`: stream a dataset through a typical pipeline and say how fast it went,
each figure with what it counts (and, with --report, the run's page: `runtime.report`). The
argument parser is `aioloader.tools.cli`'s; this is what the command does with what it parsed.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .cli_common import Progress

__all__ = ["PIPELINES", "cmd_bench"]


def _text(record: bytes) -> int:
    return len(json.loads(record))


def _image(record: bytes) -> Any:
    import numpy as np

    return np.frombuffer(record, dtype=np.uint8)


def _raw(record: bytes) -> int:
    return len(record)


_PIPELINES = {"text": _text, "images": _image, "raw": _raw}
PIPELINES = tuple(sorted(_PIPELINES))


def _rate(nbytes: float, seconds: float) -> str:
    """Bytes per second in a unit that shows a small figure as more than 0."""
    per_s = nbytes / max(seconds, 1e-9)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if per_s >= size or unit == "kB":
            value = per_s / size
            return f"{value:,.1f} {unit}/s" if value < 100 else f"{value:,.0f} {unit}/s"
    raise AssertionError


def cmd_bench(args: argparse.Namespace) -> int:
    from ..describe.dataset import Dataset
    from ..runtime.report import check_path

    if args.report:
        check_path(args.report)  # before the run: a folder is refused now, not after it
    ds = Dataset.from_arrayrecord(args.url, storage_options=args.storage_options)
    ds = ds.shuffle(args.seed)
    if args.seconds:
        ds = ds.repeat()
    ds = ds.map(_PIPELINES[args.pipeline]).batch(args.batch)
    made = time.perf_counter()
    loader = ds.loader(workers=args.workers, prefetch=args.prefetch,
                       io_concurrency=args.io_concurrency)
    t0 = time.perf_counter()  # the loader's own clock starts about here (`stats().elapsed`)
    bar = Progress(f"bench {args.pipeline}", quiet=args.quiet)
    records = 0
    waited = 0.0
    first: float | None = None
    ok = False
    try:
        batches = iter(loader)
        asked = t0
        while True:
            batch = next(batches, None)
            got = time.perf_counter()
            waited += got - asked
            if batch is None:
                break
            if first is None:
                first = got - t0
            records += len(batch)
            if bar.shown:
                bar.update(records, _rate(loader.stats().io.get("bytes", 0), got - t0))
            if args.seconds and got - t0 >= args.seconds:
                break
            asked = time.perf_counter()
        ok = True
    finally:
        bar.close(ok)
        loader.close()
    took = time.perf_counter() - t0
    stats = loader.stats()
    print("\n".join(_summary(t0 - made, first, waited, records, took, stats.io)))
    print()
    print(stats)
    if args.report:
        print(f"\nreport: {stats.report(args.report)} (open it in a browser)")
    return 0


def _summary(setup: float, first: float | None, waited: float, records: int, took: float,
             io: dict[str, Any]) -> list[str]:
    """The lines above the stats table, each saying what it counts (this loop's clock, from
    the loader's creation, as the table's)."""
    run = max(took, 1e-9)
    lines = [
        f"loader created       in {setup:.3f} s (loading the runtime's modules, once per "
        "process; not counted below)",
        f"time to first batch  {first or 0:.3f} s, from the loader's creation: opening the "
        "files, starting the workers and the first reads",
        f"waited for batches   {waited:.2f} s of {took:.2f} s ({100 * waited / run:.1f}%), the "
        "first batch's wait included; the table's \"consumer waited\" counts only from when "
        "the files were open",
        f"throughput           {records / run:,.0f} records/s ({records:,} records in "
        f"{took:.2f} s)",
    ]
    nbytes = io.get("bytes", 0)
    if nbytes:
        lines.append(f"read                 {_rate(nbytes, took)} ({nbytes / 1e6:,.1f} MB in "
                     f"{io.get('reads', 0):,} reads, as stored: compressed)")
    else:
        lines.append("read                 not measured (no read of this run was counted)")
    return lines
