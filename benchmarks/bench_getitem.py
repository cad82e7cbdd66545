"""One record at a time: `ArrayRecordSource[i]` against array_record's `ArrayRecordDataSource`.

    python -m benchmarks.bench_getitem [--records 20000] [--calls 4000] [--rounds 5] \\
        [--groups 1 --groups 64] [--gcs] [--data-dir DIR]
    PYTHONPATH=<another tree> python benchmarks/bench_getitem.py ...   # that tree's aioloader

Grain's samplers call `__getitem__` once per record. Per group size, on the same local file
(`common.dataset`: 1 KiB JSON text records, array_record's writer, zstd:3), each round times,
in turn (the order rotating from round to round, so drift hits all alike), `calls` random
indices (with repeats; the same ones for every contender within a round):

- `ours src[i]`: aioloader one call per record, default settings (verify="all", 256 MiB of
  decoded chunks kept: a group-size-64 file this size fits, so its chunks decode once);
- `ours src[i] cold` (group size > 1): `cache_bytes=0`, every call decodes its chunk, as
  a random read of a dataset much larger than the cache does;
- `array_record [i]`: `ArrayRecordDataSource.__getitem__` (its default options);
- `ours src[list]`: all `calls` indices in one call, per record.

Each contender is opened once and warmed with an untimed pass over other indices first.
The table gives µs per record (median [min–max] over rounds) and, per round, ours ÷
array_record (< 1: ours is faster). `--gcs` adds one row per group size from the local GCS
emulator (`aioloader.testing.local_gcs`, real HTTP on loopback), where array_record has no
reader: `src[i]` and `src[list]` there, without a ratio.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _per_record(fn: Callable[[list[int]], object], keys: list[int]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn(keys)
    return (time.perf_counter() - t0) / len(keys) * 1e6


def _one_at_a_time(src) -> Callable[[list[int]], object]:
    return lambda keys: [src[i] for i in keys]


def _cell(xs: list[float], digits: int = 1) -> str:
    return (f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}–"
            f"{max(xs):.{digits}f}]")


def local_rows(path: str, group: int, calls: int, rounds: int) -> list[str]:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    import aioloader as al

    ours = al.ArrayRecordSource(path)
    cold = al.ArrayRecordSource(path, cache_bytes=0)
    theirs = ArrayRecordDataSource([path])
    n = len(ours)
    assert len(theirs) == n
    fns: dict[str, Callable[[list[int]], object]] = {"ours src[i]": _one_at_a_time(ours)}
    if group > 1:
        fns["ours src[i] cold"] = _one_at_a_time(cold)
    fns["array_record [i]"] = lambda keys: [theirs[i] for i in keys]
    fns["ours src[list]"] = lambda keys: ours[keys]
    check = np.random.default_rng(99).integers(0, n, 200).tolist()
    want = [theirs[i] for i in check]
    assert [ours[i] for i in check] == want and ours[check] == want
    assert [cold[i] for i in check] == want
    warm = np.random.default_rng(100).integers(0, n, calls).tolist()
    for fn in fns.values():
        fn(warm)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        keys = np.random.default_rng(r).integers(0, n, calls).tolist()
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(_per_record(fns[name], keys))
    ours.close()
    cold.close()
    theirs.__exit__(None, None, None)
    peer = times["array_record [i]"]
    rows = []
    for name, xs in times.items():
        ratio = "—" if name == "array_record [i]" else \
            _cell([a / b for a, b in zip(xs, peer)], 2) + "×"
        rows.append(f"| {group} | {name} | {_cell(xs)} | {1e3 / statistics.median(xs):.0f}k "
                    f"| {ratio} |")
    return rows


def gcs_rows(path: str, group: int, calls: int, rounds: int) -> list[str]:
    import aioloader as al
    from aioloader.testing import local_gcs

    out = []
    with local_gcs() as gcs:
        url = gcs.upload(path, f"getitem/{Path(path).name}")
        with al.ArrayRecordSource(url, storage_options=gcs.storage_options) as src:
            n = len(src)
            src[np.random.default_rng(100).integers(0, n, calls).tolist()]  # warm
            one: list[float] = []
            many: list[float] = []
            for r in range(rounds):
                keys = np.random.default_rng(r).integers(0, n, calls).tolist()
                one.append(_per_record(_one_at_a_time(src), keys))
                many.append(_per_record(lambda k: src[k], keys))
        for name, xs in (("ours src[i] gs://", one), ("ours src[list] gs://", many)):
            out.append(f"| {group} | {name} | {_cell(xs)} | "
                       f"{1e3 / statistics.median(xs):.1f}k | — |")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--calls", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--groups", type=int, action="append")
    p.add_argument("--gcs", action="store_true", help="add the emulated bucket's rows")
    p.add_argument("--gcs-calls", type=int, default=300)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    sys.path.append(str(HERE.parent))  # (after PYTHONPATH: a tree to measure may come first)
    import aioloader
    from benchmarks.common import dataset, machine_info

    print(machine_info())
    print(f"aioloader from {Path(aioloader.__file__).parent.parent}")
    print("\n| group size | contender | µs/record | records/s | ÷ array_record [i] |\n"
          "|---:|---|---:|---:|---:|")
    for group in args.groups or [1, 64]:
        path = str(dataset(args, "text", args.records, group_size=group))
        for row in local_rows(path, group, args.calls, args.rounds):
            print(row, flush=True)
        if args.gcs:
            for row in gcs_rows(path, group, args.gcs_calls, args.rounds):
                print(row, flush=True)


if __name__ == "__main__":
    main()
