"""CPU time per record of `apply_record_ops` (map + random_map + filter): the per-record
path the flat_map change touched. Run once per tree, ABBA: `PYTHONPATH=<tree> python
benchmarks/micro_record_ops.py` prints microseconds per record (best of 7)."""

import time

from aioloader.elements.transforms import FilterOp, MapOp, RandomMapOp, apply_record_ops


def inc(x):
    return x + 1


def same(x, rng):
    return x


def keep(x):
    return x % 3 != 0


def main() -> None:
    ops = (MapOp(inc), RandomMapOp(same, 1), FilterOp(keep))
    els, idx, ep = list(range(4096)), list(range(4096)), [0] * 4096
    best = 1e9
    for _ in range(7):
        t = time.process_time()
        for _ in range(10):
            apply_record_ops(ops, els, idx, ep)
        best = min(best, (time.process_time() - t) / (10 * 4096))
    print(f"{best * 1e6:.3f}")


if __name__ == "__main__":
    main()
