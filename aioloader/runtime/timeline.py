"""The stats over time: a bounded ring of snapshots of a running loader's counters, and the
per-interval figures read from them (what the HTML report plots).

A snapshot holds the counters as they stood at one moment (batches, the consumer's wait,
each stage's busy core-seconds, reads, retries, cache hits: all cumulative, plus the
stages' cores), so the figures of any span are the difference of its two ends: dropping a
snapshot loses resolution, never a count. `PipelineStats` asks for one as the consumer gets
each batch, at most one per `interval` s, so an idle loader costs nothing. When
`max_samples` are held, every other one goes (the first, the loader's start, stays) and the
interval doubles: a run of any length keeps between half and all of `max_samples`, from its
start to now, in bounded memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_SAMPLES", "Snapshot", "Timeline", "rates"]

DEFAULT_INTERVAL = 0.5  # seconds between snapshots, until the ring first fills
DEFAULT_SAMPLES = 512  # snapshots kept at most (each a small dict: well under 1 MB in all)

# A snapshot: "t" (seconds since the loader started) and cumulative counters by name.
Snapshot = dict[str, float]
Probe = Callable[[float], Snapshot]


class Timeline:
    """Snapshots taken by `probe(t)` (`t`: seconds since the loader started), the oldest
    first; see the module docstring for how they are kept bounded."""

    def __init__(self, probe: Probe, interval: float = DEFAULT_INTERVAL,
                 max_samples: int = DEFAULT_SAMPLES) -> None:
        if not interval > 0:
            raise ValueError(f"a timeline's interval is a positive number of seconds, got "
                             f"{interval!r}")
        if max_samples < 3:
            raise ValueError(f"a timeline keeps at least 3 samples (its start, one step and "
                             f"now), got max_samples={max_samples}")
        self.probe = probe
        self.interval = interval
        self.max_samples = max_samples
        self._samples: list[Snapshot] = []
        self._due = float("-inf")  # when the next snapshot is due (the last one's t + interval)
        self._lock = threading.Lock()  # ticks come from the loop, reads from any thread

    def tick(self, t: float) -> bool:
        """Take a snapshot at `t` if the last one is at least `interval` old (or there is
        none); whether one was taken."""
        if t < self._due:
            return False
        self.take(t)
        return True

    def take(self, t: float) -> None:
        """Take a snapshot at `t` now (a `t` before the last one's is refused)."""
        snap = self.probe(t)
        snap["t"] = t
        with self._lock:
            if self._samples and t < self._samples[-1]["t"]:
                raise ValueError(f"a snapshot at {t} s comes after one at "
                                 f"{self._samples[-1]['t']} s")
            self._samples.append(snap)
            if len(self._samples) > self.max_samples:
                self._samples = self._samples[::2]
                self.interval *= 2
            self._due = self._samples[-1]["t"] + self.interval

    def samples(self, now: float | None = None) -> list[Snapshot]:
        """The snapshots kept, oldest first (copies); with `now`, one more taken then and
        not kept (the figures up to the moment asked)."""
        with self._lock:
            out = [dict(s) for s in self._samples]
        if now is not None and (not out or now > out[-1]["t"]):
            snap = self.probe(now)
            snap["t"] = now
            out.append(snap)
        return out

    def __len__(self) -> int:
        return len(self._samples)


def _delta(a: Mapping[str, float], b: Mapping[str, float], key: str) -> float:
    return b.get(key, 0.0) - a.get(key, 0.0)


def rates(samples: Sequence[Mapping[str, float]], stages: Sequence[str]) -> dict[str, Any]:
    """What happened between each snapshot and the one before it, at the later one's time:

    - "t": the end of each interval (seconds since the loader started)
    - "batches_per_s", "records_per_s"
    - "wait_pct": the share of the interval the consumer spent waiting for a batch
    - "busy_pct": {stage: the share of the interval x the stage's cores it was busy}
    - "reads_in_flight": reads in flight on average (summed read latency / interval)
    - "cache_hits_per_s", "cache_misses_per_s": the chunk cache's
    - "retries": retries of failed reads so far (cumulative: they are rare)

    Percentages are capped at 100 (figures reported by workers may land late); an interval
    of no length (two snapshots at one time) is skipped.
    """
    out: dict[str, Any] = {"t": [], "batches_per_s": [], "records_per_s": [], "wait_pct": [],
                           "busy_pct": {name: [] for name in stages}, "reads_in_flight": [],
                           "cache_hits_per_s": [], "cache_misses_per_s": [], "retries": []}
    for a, b in pairwise(samples):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        out["t"].append(b["t"])
        out["batches_per_s"].append(_delta(a, b, "batches") / dt)
        out["records_per_s"].append(_delta(a, b, "records") / dt)
        out["wait_pct"].append(min(100.0, 100 * _delta(a, b, "wait_s") / dt))
        for name in stages:
            cores = max(1.0, b.get(f"cores:{name}", 1.0))
            busy = 100 * _delta(a, b, f"busy:{name}") / (dt * cores)
            out["busy_pct"][name].append(min(100.0, max(0.0, busy)))
        out["reads_in_flight"].append(max(0.0, _delta(a, b, "io_busy_s") / dt))
        out["cache_hits_per_s"].append(_delta(a, b, "cache_hits") / dt)
        out["cache_misses_per_s"].append(_delta(a, b, "cache_misses") / dt)
        out["retries"].append(b.get("retries", 0.0))
    return out
