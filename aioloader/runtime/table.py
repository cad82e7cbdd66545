"""The table `print(it.stats())` shows: one row per stage and transform, then the I/O and
cache lines (kept apart from `stats`, which owns the figures: this only formats them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render(d: dict[str, Any], graph: Sequence[str] = (),
           units: Mapping[str, str] | None = None) -> str:
    """The table `str(stats)` prints, from `d = stats.as_dict()`, the pipeline's `graph`
    (its stages, one a line) and what each stage's cores are called (`units`; "workers")."""
    elapsed = d["elapsed_s"] or 1e-9
    ttfb = d["time_to_first_batch_s"]
    lines = ["pipeline: " + " -> ".join(graph)] if graph else []
    lines.append(
        f"{d['batches']:,} batches, {d['records']:,} records in {elapsed:.2f} s "
        f"({d['records_per_s']:,.0f} records/s); first batch after "
        + (f"{ttfb:.3f} s" if ttfb is not None else "-")
    )
    lines.append(f"consumer waited {d['wait_s']:.2f} s ({100 * d['wait_fraction']:.1f}% "
                 f"of the time); {d['mean_ready_batches']:.1f} of {d['prefetch']} batches "
                 "ready on average")
    lines += _table(d, units or {})
    lines += _io_lines(d["io"], d["cache"], elapsed)
    return "\n".join(lines)


def _table(d: dict[str, Any], units: Mapping[str, str]) -> list[str]:
    rows = [("stage", "items", "total s", "per item", "max call", "busy", "peak in flight")]
    for name, s in d["stages"].items():
        if not s["items"]:
            continue
        cores, unit = s["cores"], units.get(name, "workers")
        rows.append((name, f"{s['items']:,}", f"{s['total_s']:.2f}", _dur(s["mean_s"]),
                     _dur(s["max_s"]), _busy(s["busy_fraction"], cores, unit),
                     str(s["peak_in_flight"])))
        for op_name, op in d["transforms"].items():
            if op["stage"] == name:
                rows.append(("  " + op_name, f"{op['items']:,}", f"{op['total_s']:.2f}",
                             _dur(op["mean_s"]), _dur(op["max_s"]),
                             _busy(op["busy_fraction"], cores, unit), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _io_lines(io: dict[str, Any], cache: dict[str, int], elapsed: float) -> list[str]:
    lines = []
    if io:
        mb = io.get("bytes", 0) / 1e6
        by_workers = (f" ({io['worker_reads']:,} by the workers)"
                      if io.get("worker_reads") else "")
        lines.append(
            f"I/O: {io.get('reads', 0):,} reads{by_workers}, {mb:,.1f} MB "
            f"({mb / elapsed:,.1f} MB/s), {io.get('retries', 0)} retries, "
            f"{io.get('hedges', 0)} hedges ({io.get('hedge_wins', 0)} won), "
            f"peak {io.get('peak_in_flight', 0)} in flight, "
            f"{io.get('records_per_read', 0):.1f} records per read"
        )
    if cache.get("hits", 0) or cache.get("misses", 0):
        lines.append(f"chunk cache: {cache['hits']:,} hits, {cache['misses']:,} misses, "
                     f"{cache.get('bytes', 0) / 1e6:.1f} MB held")
    if cache.get("tier_fetched"):
        lines.append(f"kept in memory (in part: the dataset is larger than resident_bytes, "
                     f"{cache['tier_capacity'] / 1e6:,.1f} MB): "
                     f"{cache['resident_bytes'] / 1e6:,.1f} MB in "
                     f"{cache['resident_segments']:,} segments now; "
                     f"{cache['tier_fetched']:,} segments fetched "
                     f"({cache['tier_fetched_bytes'] / 1e6:,.1f} MB), "
                     f"{cache['tier_evictions']:,} evicted, "
                     f"{cache['tier_records']:,} records read from them")
    elif cache.get("resident_segments"):
        lines.append(f"kept in memory: {cache['resident_bytes'] / 1e6:,.1f} MB in "
                     f"{cache['resident_segments']:,} segments (the whole dataset fits "
                     "resident_bytes; later epochs read no bytes)")
    return lines


def _busy(fraction: float, cores: int, unit: str) -> str:
    pct = f"{100 * fraction:.0f}%"
    return f"{pct} of {cores} {unit}" if cores > 1 else pct


def _dur(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"
