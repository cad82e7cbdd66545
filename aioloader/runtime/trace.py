"""A Chrome/Perfetto trace of a running loader: where time goes, per stage and per worker.

Off unless asked for (`ds.loader(trace=...)`, or AIOLOADER_TRACE=path): then the stage hooks
of `stats` and the task runner hand each finished span here, and `it.stats().trace(path)`
writes them as Trace Event Format JSON, which chrome://tracing, https://ui.perfetto.dev and
`speedscope` open. When off, the hooks cost one attribute test per call.

What the viewer shows:
- this process ("aioloader"): one row per stage, and more rows when calls of one stage
  overlap ("fetch #0", "fetch #1": concurrent fetches on one event loop never overlap on a
  row); "decode+transform" there is the parent waiting for the pool; "consumer" is the
  training loop waiting for its next batch (the time it was input-bound).
- one process per worker (workers=0: the inline thread in this process): each task, and in
  it the read and decode of its records, each transform, and "collate" (batching, the maps
  after batch, handing the batch back). Record transforms run op by op over the whole task,
  so laid end to end from their measured times they are where they ran; maps after batch
  run once per batch, and are shown together at the end of "collate".

One clock: the parent's spans are `time.perf_counter()`, the workers' `perf_counter_ns()`.
On Linux both read CLOCK_MONOTONIC, which every process of the machine shares, so a
worker's span lines up with the parent's without any offset exchange (macOS's
mach_absolute_time and Windows' QueryPerformanceCounter are system-wide too).

Bounded memory: the last `max_events` spans are kept (a ring; 200,000 by default, about
40 MB at most); older ones are dropped and counted (`dropped`, in the file's metadata).
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from typing import Any

__all__ = ["DEFAULT_EVENTS", "Trace"]

DEFAULT_EVENTS = 200_000
_LANE_TIDS = 1 << 30  # virtual thread ids of the parent's stage rows (above real tids)
_BATCH_OP = " [per batch]"  # how `Plan.op_names` marks a map after batch
_POOL_STAGE = "decode+transform"  # `stats.PROCESS`: in this process, waiting for the pool

# A span: (name, category, pid, tid, start s, duration s, args or None)
Span = tuple[str, str, int, int, float, float, Any]


class Trace:
    """The spans of one loader, newest `max_events` kept (see the module docstring)."""

    def __init__(self, origin: float, max_events: int = DEFAULT_EVENTS) -> None:
        if max_events < 1:
            raise ValueError(f"a trace keeps at least 1 event, got max_events={max_events}")
        self.origin = origin  # perf_counter() seconds shown as 0 (the loader's start)
        self.max_events = max_events
        self.pid = os.getpid()
        self.spans: deque[Span] = deque(maxlen=max_events)
        self.recorded = 0  # spans ever recorded (recorded - len(spans) were dropped)
        self._lanes: dict[str, list[float]] = {}  # stage -> each row's last end
        self._rows: dict[tuple[str, int], int] = {}  # (stage, row) -> virtual tid
        self._workers: set[tuple[int, int]] = set()  # (pid, tid) of the threads tasks ran on
        self._lock = threading.Lock()  # spans come from the loop and the sync pump

    @property
    def dropped(self) -> int:
        return self.recorded - len(self.spans)

    def _add(self, span: Span) -> None:
        with self._lock:
            self.spans.append(span)
            self.recorded += 1

    # -- what the hooks call ------------------------------------------------------------

    def stage(self, name: str, start: float, end: float, items: int = 1) -> None:
        """A call of stage `name` in this process, `start`..`end` (perf_counter s).

        Spans arrive as calls end, so each ends no earlier than those before it: a row
        whose last span ended by `start` can take it without overlapping any (greedy rows).
        """
        with self._lock:
            rows = self._lanes.setdefault(name, [])
            for row, last in enumerate(rows):
                if last <= start:
                    rows[row] = end
                    break
            else:
                row = len(rows)
                rows.append(end)
            tid = self._rows.get((name, row))
            if tid is None:
                tid = self._rows[(name, row)] = _LANE_TIDS + len(self._rows)
            self.spans.append((name, "stage", self.pid, tid, start, end - start,
                               {"items": items}))
            self.recorded += 1

    def task(self, result: Any, op_names: list[str], task_id: int) -> None:
        """The spans of one task in the worker that ran it (`workers.Result`'s times)."""
        began, decoded, ended = result.began_ns, result.decoded_ns, result.ended_ns
        if not ended:
            return  # a result without times (a rerun's request for a larger slot)
        pid, tid = result.pid, result.tid
        t0, t1, t2 = began * 1e-9, decoded * 1e-9, ended * 1e-9
        spans: list[Span] = [
            (f"task {task_id}", "task", pid, tid, t0, t2 - t0, {"elements": result.count}),
            ("read+decode", "decode", pid, tid, t0, t1 - t0,
             {"chunks_decoded": result.chunks_decoded, "chunk_hits": result.chunk_hits}),
        ]
        at = t1
        per_batch = []
        for name, items, secs in zip(op_names, result.op_items, result.op_seconds):
            if name.endswith(_BATCH_OP):
                per_batch.append((name, items, secs))
                continue
            secs = min(secs, max(0.0, t2 - at))
            spans.append((name, "transform", pid, tid, at, secs, {"items": items}))
            at += secs
        spans.append(("collate", "collate", pid, tid, at, t2 - at, None))
        at = t2 - min(t2 - at, sum(s for _, _, s in per_batch))
        for name, items, secs in per_batch:
            secs = min(secs, t2 - at)
            spans.append((name, "transform", pid, tid, at, secs, {"batches": items}))
            at += secs
        with self._lock:
            self._workers.add((pid, tid))
            self.spans.extend(spans)
            self.recorded += len(spans)

    def wait(self, start: float, end: float) -> None:
        """The consumer waited `start`..`end` for its next batch."""
        self._add(("wait for batch", "consumer", self.pid, _LANE_TIDS - 1, start,
                   end - start, None))

    # -- the file -----------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """The Trace Event Format events: metadata (names of processes and rows), then
        one complete event ("ph": "X") per span, times in microseconds from `origin`."""
        with self._lock:
            spans = list(self.spans)
            rows, workers = dict(self._rows), sorted(self._workers)
        us, origin = 1e6, self.origin
        out: list[dict[str, Any]] = [
            _meta("process_name", self.pid, 0, f"aioloader (pid {self.pid})"),
            _meta("process_sort_index", self.pid, 0, -1, key="sort_index"),
            _meta("thread_name", self.pid, _LANE_TIDS - 1, "consumer (waiting for a batch)"),
        ]
        for (stage, row), tid in rows.items():
            what = " (sent to the pool, waiting)" if stage == _POOL_STAGE else ""
            out.append(_meta("thread_name", self.pid, tid, f"{stage} #{row}{what}"))
        named: set[int] = set()
        for pid, tid in workers:  # (threads of this process: one row each)
            if pid != self.pid and pid not in named:
                out.append(_meta("process_name", pid, 0, f"aioloader worker (pid {pid})"))
                out.append(_meta("process_sort_index", pid, 0, len(named), key="sort_index"))
                named.add(pid)
            out.append(_meta("thread_name", pid, tid, "worker" if pid != self.pid else
                             "tasks run in this process (workers=0, threads, or while "
                             "workers start)"))
        for name, cat, pid, tid, start, dur, args in spans:
            ev = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                  "ts": round((start - origin) * us, 3), "dur": round(max(dur, 0.0) * us, 3)}
            if args:
                ev["args"] = args
            out.append(ev)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"traceEvents": self.events(), "displayTimeUnit": "ms",
                "otherData": {"producer": "aioloader", "clock": "CLOCK_MONOTONIC "
                              "(time.perf_counter), microseconds from the loader's start",
                              "spans": len(self.spans), "dropped": self.dropped,
                              "max_events": self.max_events}}

    def write(self, path: str | os.PathLike[str]) -> str:
        """Write the trace to `path` (atomically: a viewer never sees half a file)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, separators=(",", ":"))
        os.replace(tmp, path)
        return path


def _meta(name: str, pid: int, tid: int, value: Any, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}
