"""Per-stage figures of a running pipeline, the summary table and the pipeline graph.

Every stage counts its items and the time it spent; the consumer's waiting time says
whether the pipeline keeps up (a training loop that waits > 1% of its time is input-bound).
`print(it.stats())` gives a table a person can read; `.as_dict()` gives the same for machines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageStats:
    """One stage: how many items it finished and how long they took."""

    name: str
    items: int = 0
    seconds: float = 0.0  # busy time summed over concurrent work
    in_flight: int = 0
    peak_in_flight: int = 0

    def begin(self) -> float:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        return time.perf_counter()

    def end(self, t0: float, items: int = 1) -> None:
        self.in_flight -= 1
        self.items += items
        self.seconds += time.perf_counter() - t0


@dataclass
class PipelineStats:
    """Figures of one loader since it started."""

    started: float = field(default_factory=time.perf_counter)
    first_batch_seconds: float | None = None
    batches: int = 0
    records: int = 0  # records read from storage (before filters)
    elements: int = 0  # elements that survived filters
    wait_seconds: float = 0.0  # time the consumer spent waiting for the next batch
    ready_samples: int = 0
    ready_total: int = 0  # sum of ready batches seen at each request (queue occupancy)
    fetch: StageStats = field(default_factory=lambda: StageStats("fetch"))
    process: StageStats = field(default_factory=lambda: StageStats("decode+transform"))
    assemble: StageStats = field(default_factory=lambda: StageStats("assemble"))
    io: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)
    workers: int = 0
    prefetch: int = 0
    graph: list[str] = field(default_factory=list)
    batches_per_task: int = 1  # how many batches a task covers now (they grow; see plan)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def as_dict(self) -> dict[str, Any]:
        elapsed = self.elapsed
        return {
            "elapsed_s": elapsed,
            "time_to_first_batch_s": self.first_batch_seconds,
            "batches": self.batches,
            "records": self.records,
            "elements": self.elements,
            "records_per_s": self.records / elapsed if elapsed else 0.0,
            "wait_s": self.wait_seconds,
            "wait_fraction": self.wait_seconds / elapsed if elapsed else 0.0,
            "mean_ready_batches": self.ready_total / self.ready_samples
            if self.ready_samples else 0.0,
            "stages": {s.name: {"items": s.items, "busy_s": s.seconds,
                                "peak_in_flight": s.peak_in_flight}
                       for s in (self.fetch, self.process, self.assemble)},
            "io": dict(self.io),
            "cache": dict(self.cache),
            "workers": self.workers,
            "prefetch": self.prefetch,
            "batches_per_task": self.batches_per_task,
        }

    def __str__(self) -> str:
        d = self.as_dict()
        elapsed = d["elapsed_s"] or 1e-9
        ttfb = d["time_to_first_batch_s"]
        lines = ["pipeline: " + " -> ".join(self.graph)] if self.graph else []
        lines.append(
            f"{d['batches']:,} batches, {d['records']:,} records in {elapsed:.2f} s "
            f"({d['records_per_s']:,.0f} records/s); first batch after "
            + (f"{ttfb:.3f} s" if ttfb is not None else "-")
        )
        lines.append(f"consumer waited {d['wait_s']:.2f} s ({100 * d['wait_fraction']:.1f}% "
                     f"of the time); {d['mean_ready_batches']:.1f} of {self.prefetch} batches "
                     "ready on average")
        rows = [("stage", "items", "busy s", "busy %", "peak in flight")]
        for s in (self.fetch, self.process, self.assemble):
            if not s.items:
                continue
            rows.append((s.name, f"{s.items:,}", f"{s.seconds:.2f}",
                         f"{100 * s.seconds / elapsed:.0f}%", str(s.peak_in_flight)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for k, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))))
            if k == 0:
                lines.append("  ".join("-" * w for w in widths))
        io = d["io"]
        if io:
            mb = io.get("bytes", 0) / 1e6
            lines.append(
                f"I/O: {io.get('reads', 0):,} reads, {mb:,.1f} MB ({mb / elapsed:,.1f} MB/s), "
                f"{io.get('retries', 0)} retries, {io.get('hedges', 0)} hedges "
                f"({io.get('hedge_wins', 0)} won), peak {io.get('peak_in_flight', 0)} in flight, "
                f"{io.get('records_per_read', 0):.1f} records per read"
            )
        cache = d["cache"]
        if cache.get("hits", 0) or cache.get("misses", 0):
            lines.append(f"chunk cache: {cache['hits']:,} hits, {cache['misses']:,} misses, "
                         f"{cache.get('bytes', 0) / 1e6:.1f} MB held")
        if cache.get("resident_segments"):
            lines.append(f"kept in memory: {cache['resident_bytes'] / 1e6:,.1f} MB in "
                         f"{cache['resident_segments']:,} segments (the whole dataset fits "
                         "resident_bytes; later epochs read no bytes)")
        return "\n".join(lines)
