"""The Ray executor's figures (`stats().as_dict()["transfers"]` and the table's "Ray actors"
line): how results came back, tasks run again, actors replaced, bytes sent with tasks, the
time a task spends on its way out and back, and each actor's tasks and time running them.
One owner: the executor's `RayActors` counts here as results come back.
"""

from __future__ import annotations

import time

from .messages import Result


class Tally:
    """The Ray executor's figures: its counts, and each actor's tasks and time."""

    def __init__(self, workers: int) -> None:
        self.rows: list[dict[str, float]] = [{"tasks": 0, "seconds": 0.0}
                                             for _ in range(workers)]
        self.counts = {"by_value": 0, "in_slot": 0, "reruns": 0, "replaced": 0, "sent_bytes": 0,
                       "wait_ns": 0, "return_ns": 0}
        self.calls = 0  # calls to the actors (a call carries one task or more)

    def came_back(self, at: int, result: Result, sent: int) -> None:
        now = time.perf_counter_ns()
        c, row = self.counts, self.rows[at]
        c["in_slot" if result.slot >= 0 else "by_value"] += 1
        row["tasks"] += 1
        row["seconds"] += max(0, result.ended_ns - result.began_ns) / 1e9
        # The clocks compare on one host only (CLOCK_MONOTONIC): elsewhere these stay 0.
        if result.pid and sent <= result.began_ns <= result.ended_ns <= now:
            c["wait_ns"] += result.began_ns - sent  # sent to started: the queue, the hop
            c["return_ns"] += now - result.ended_ns  # finished to here: the way back

    def figures(self, actors: int) -> dict[str, int]:
        """`actors`; `in_slot` (results in a shared-memory slot, from actors on this host)
        and `by_value` (through the object store, or pickled); `calls` (to the
        actors, each of one task or more); `reruns` (tasks
        run again after their actor died) and `replaced` (actors made in a dead one's
        place); `sent_bytes` (fetched chunks sent with tasks); `wait_ms` and `return_ms`
        (the time tasks spent from here to their start, and from their end back here, on
        one host); and each actor's `actorN_tasks`, `actorN_ms` (time running tasks)."""
        c = self.counts
        out = {"actors": actors, "in_slot": c["in_slot"], "by_value": c["by_value"],
               "calls": self.calls,
               "reruns": c["reruns"],
               "replaced": c["replaced"], "sent_bytes": c["sent_bytes"],
               "wait_ms": c["wait_ns"] // 1_000_000, "return_ms": c["return_ns"] // 1_000_000}
        for k, row in enumerate(self.rows):
            out[f"actor{k}_tasks"] = int(row["tasks"])
            out[f"actor{k}_ms"] = int(row["seconds"] * 1000)
        return out
