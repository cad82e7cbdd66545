"""The table `print(it.stats())` shows: one row per stage and transform, then the I/O and
cache lines (kept apart from `stats`, which owns the figures: this only formats them), and
its legend (`stats().legend()`), each column and line explained once.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

# what reads through horizons are, by the order they serve (`StashChoice.order`), and what
# to do instead of more horizons: the stats line's words and the loader's warning's
READS = {"exact": "exact shuffle", "block": "block shuffle", "sequential": "a read in order"}
INSTEAD = {"exact": "use shuffle(strategy=\"block\")",
           "block": "use smaller windows (window_bytes), which each process keeps whole",
           "sequential": "write the files with smaller groups"}

FOOTER = "(it.stats().legend() explains each column and line)"

# Each label the table prints, as it prints it, and what it means.
LEGEND: tuple[tuple[str, str], ...] = (
    ("pipeline", "the dataset's steps, in order, as the loader runs them"),
    ("batches, records", "what you got so far, the time since the loader started, and "
     "records/s over it; first batch after: how long the first batch took"),
    ("consumer waited", "the time your loop spent waiting for the next batch, and its share "
     "of the time (over 1%: loading holds training back); batches ready: how many of the "
     "`prefetch` batches were ready when you asked, on average"),
    ("executor", "where the tasks ran (`executor=`): processes (worker processes), threads "
     "(threads of this process), ray (Ray actors), or inline (workers=0: one thread of this "
     "process), and how many workers it had (with workers=\"auto\", the tuner's count now)"),
    ("stage", "one row per stage, in pipeline order; a stage that did nothing is left out"),
    ("fetch", "getting the records' bytes to the workers: reads from a bucket (or its "
     "caches) in this process, or waiting for an exact shuffle's records pulled out of large "
     "chunks. Local files are read by the workers themselves: no fetch row, their reads are "
     "on the I/O line and their time inside decode+transform"),
    ("decode+transform", "a task from being handed to the workers to its batch coming back: "
     "reading local files, decoding, your transforms, batching (queued tasks included)"),
    ("assemble", "joining the workers' pieces into the batches you get"),
    ("transform", "(indented rows) one of your transforms (map, filter, ...), timed in the "
     "workers, under the stage that runs it; a transform used twice has a row per use (#2)"),
    ("items", "records (or elements) that went through the row"),
    ("total s", "seconds spent in the row, summed over calls (calls in flight together add "
     "up, so this can exceed the run's time)"),
    ("per item", "total s / items"),
    ("max call", "the longest single call (a task, for the workers' rows)"),
    ("busy", "the share of the run's time the row kept its cores busy, at most 100% (calls "
     "in flight together count once); \"of N workers\": shared over N processes"),
    ("peak in flight", "the most calls of the stage running at once"),
    ("I/O", "reads of the dataset's bytes: reads (those the workers made of local files "
     "themselves, counted apart), MB read and MB/s over the run, retries of failed reads, "
     "hedges (duplicate requests sent for slow reads, and how many answered first), peak "
     "in flight (reads at once in this process: the workers' own reads are not measured), "
     "records per read"),
    ("chunk cache", "chunks of a remote dataset found already read (hits) or read (misses), "
     "and the MB it holds"),
    ("exact shuffle over large chunks", "an exact shuffle of files whose chunks decode to "
     "megabytes: its positions are cut into horizons of as many records as half of "
     "`memory_budget` holds, and every chunk is decoded once a horizon. The horizons one "
     "epoch of this loader (its shard or slice) needs, the records each holds and the "
     "horizons filled so far; shown when an epoch needs more than one (the loader also "
     "warns, once)"),
    ("block shuffle over large chunks", "the same, for a block shuffle whose window does "
     "not fit what a process keeps: its records are shuffled together, so its chunks are "
     "filled into horizons as an exact shuffle's are"),
    ("a read in order over large chunks", "the same, for a read in order"),
    ("kept in memory", "a remote dataset's bytes held in memory (`resident_bytes`): later "
     "epochs read no bytes; \"in part\" when the dataset is larger"),
    ("Ray actors", "executor=\"ray\": the actors, the tasks each ran and its time running "
     "them, the calls that carried them (several tasks to a call while the actors are "
     "busy), tasks run again because their actor died (and actors made in place of dead "
     "ones), MB of fetched chunks sent with the tasks, and per task the time from being "
     "sent to starting (queued at the actor, the hop) and from its end to its batch being "
     "here (the way back through the object store; measured when the actors share this "
     "host's clock)"),
)


def legend() -> str:
    """What each column and line of the table means, one entry a label."""
    width = max(len(label) for label, _ in LEGEND) + 2
    body = [textwrap.fill(text, 92, initial_indent=f"  {label}".ljust(width + 2),
                          subsequent_indent=" " * (width + 2)) for label, text in LEGEND]
    return "\n".join(["What the columns and lines of stats() mean:", *body])


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
    if d.get("executor"):
        lines.append(f"executor: {d['executor']}" + (
            "" if d["executor"] == "inline" else f", {d['workers']} workers"))
    lines += _table(d, units or {})
    lines += _io_lines(d["io"], d["cache"], elapsed)
    lines += _actor_lines(d.get("transfers") or {})
    lines.append(FOOTER)
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


def _io_lines(io: dict[str, Any], cache: dict[str, Any], elapsed: float) -> list[str]:
    lines = []
    if io:
        mb = io.get("bytes", 0) / 1e6
        workers = io.get("worker_reads", 0)
        by_workers = f" ({workers:,} by the workers)" if workers else ""
        if not workers:
            peak = f"peak {io.get('peak_in_flight', 0)} in flight"
        elif io.get("reads", 0) > workers:  # some reads here (the files' indexes), the rest there
            peak = (f"peak {io.get('peak_in_flight', 0)} in flight here (the workers': "
                    "not measured)")
        else:
            peak = "peak in flight not measured (the workers read the files)"
        lines.append(
            f"I/O: {io.get('reads', 0):,} reads{by_workers}, {_mb(mb)} MB "
            f"({_mb(mb / elapsed)} MB/s), {io.get('retries', 0)} retries, "
            f"{io.get('hedges', 0)} hedges ({io.get('hedge_wins', 0)} won), {peak}, "
            f"{io.get('records_per_read', 0):.1f} records per read"
        )
    if cache.get("hits", 0) or cache.get("misses", 0):
        lines.append(f"chunk cache: {cache['hits']:,} hits, {cache['misses']:,} misses, "
                     f"{cache.get('bytes', 0) / 1e6:.1f} MB held")
    if cache.get("horizons_per_epoch", 0) > 1:
        spilled, refused = cache.get("spill_bytes", 0), cache.get("spill_refused", 0)
        how = (f"the spill holds {spilled / 1e6:,.1f} MB of decoded records and served "
               f"{cache.get('spill_hits', 0):,} chunks' fills without decoding them"
               if spilled else "no spill: each chunk decoded once per horizon")
        if refused:
            how = (f"{how} (then refused (disk full): the chunks not in it decoded once "
                   "per horizon)" if spilled else
                   "spill refused (disk full): each chunk decoded once per horizon")
        order = cache.get("horizon_order", "exact")
        lines.append(f"{READS[order]} over large chunks: {cache['horizons_per_epoch']} horizons "
                     f"an epoch, of {cache['horizon_records']:,} records each "
                     f"({cache['horizons']:,} filled); {how}; raise memory_budget for fewer, "
                     f"or {INSTEAD[order]}")
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


def _actor_lines(t: dict[str, Any]) -> list[str]:
    """The Ray executor's line (`workers.ray.RayActors.figures`), when it ran the tasks."""
    if "actors" not in t:
        return []
    n, tasks = t["actors"], max(1, t.get("by_value", 0) + t.get("in_slot", 0))
    each = " / ".join(f"{t.get(f'actor{k}_tasks', 0):,} ({_dur(t.get(f'actor{k}_ms', 0) / 1e3)})"
                      for k in range(n))
    calls = f" in {t['calls']:,} calls" if "calls" in t else ""
    return [f"Ray actors: {n}, tasks (time running them) {each}{calls}; "
            f"{t.get('reruns', 0)} reruns "
            f"({t.get('replaced', 0)} actors replaced), {_mb(t.get('sent_bytes', 0) / 1e6)} MB "
            f"sent with tasks; per task {_dur(t.get('wait_ms', 0) / 1e3 / tasks)} to start, "
            f"{_dur(t.get('return_ms', 0) / 1e3 / tasks)} back"]


def _busy(fraction: float, cores: int, unit: str) -> str:
    pct = f"{100 * fraction:.0f}%"
    return f"{pct} of {cores} {unit}" if cores > 1 else pct


def _mb(mb: float) -> str:
    """MB with one decimal, or three below 0.1 (a few KB read is not "0.0 MB")."""
    return f"{mb:,.1f}" if mb >= 0.1 or mb == 0 else f"{mb:.3f}"


def _dur(seconds: float) -> str:
    if 0 < seconds < 0.5e-6:
        return "<1 us"  # measured, under a microsecond: not "0 us"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"
