"""Stream-mode pipelines: filter + batch and pack + batch of text, against plain batching.

A filter or a pack puts the loader in stream mode (batch boundaries depend on what survives),
which takes a different data path from plain batching. This table shows what that path
costs, on the `pipeline` benchmark's text data (1 KiB JSON records, 20 shards, group_size 1,
global shuffle), aioloader alone, workers=2:

- `batch` (the control): json.loads → batch 256 (batch mode);
- `filter`: json.loads → filter (even label, ~½ kept) → batch 256;
- `pack`: json.loads → 50–1000 int32 tokens → pack({"tokens": 2048}, 16 bins) → batch 8.

The three run in turn within every repeat, in an order that rotates each repeat, after one
untimed warm-up of each. Rates are input records (before the filter) per second after the
first batch, so spawning the workers is left out; the ratio is each pipeline ÷ the control,
paired per repeat. Also per pipeline: CPU of the parent process alone per record (its event
loop thread included: what the parent does besides waiting), and, in separate runs with a
training step (a `time.sleep` after each batch, sized so that the step alone allows
20k input records/s whatever the pipeline), the share of wall time after the first batch that
the consumer spent waiting inside next(): ~0% when the pipeline keeps up with that demand.

`python -m benchmarks run --only stream [--quick] [--repeats N]`.
"""

from __future__ import annotations

import gc
import statistics
from pathlib import Path
from typing import Any

from .bench_pipeline import BATCH, SHARDS, TEXT_BYTES, reps, sizes
from .common import Row, Runs, Stats, log, register, sharded_dataset, throughput_row
from .contenders import run as run_pipeline

WORKERS = 2
DEMAND = 20_000  # input records/s the training step allows, in the waiting runs
PACK = {"lengths": {"tokens": 2048}, "bins": 16}
PACK_BATCH = 8

#: name: (what it does, spec, epochs per run with --quick / without). Runs last long enough
#: that a slow start or a full prefetch buffer at the first batch weighs little.
PIPELINES: dict[str, tuple[str, dict[str, Any], tuple[int, int]]] = {
    "batch": (f"json.loads → batch {BATCH} (control, batch mode)",
              {"decode": "decode_text", "batch": BATCH}, (5, 2)),
    "filter": (f"json.loads → filter (even label, ~½ kept) → batch {BATCH}",
               {"decode": "decode_text", "filter": "keep_even_label", "batch": BATCH}, (5, 2)),
    "pack": (f"json.loads → 50–1000 int32 tokens → pack 2048 × {PACK['bins']} bins → "
             f"batch {PACK_BATCH}",
             {"decode": "text_tokens", "pack": PACK, "batch": PACK_BATCH}, (2, 1)),
}


def _spec(paths: list[Path], extra: dict[str, Any], epochs: int) -> dict[str, Any]:
    return {"lib": "aioloader", "paths": [str(p) for p in paths], "seed": 0,
            "workers": WORKERS, "epochs": epochs, **extra}


def _steady(result: dict[str, Any], records: int) -> dict[str, float]:
    """Input records and seconds after the first batch (the input share of the first batch
    estimated from its share of the output)."""
    out = result["records"]
    return {"records": records * (out - result["first_size"]) / out,
            "wall": result["wall"] - result["ttfb"], "cpu": result["cpu"]}


def _runs(results: list[dict[str, Any]], records: int) -> Runs:
    steady = [_steady(r, records) for r in results]
    return Runs([s["wall"] / s["records"] for s in steady],
                [r["cpu"] / records for r in results])


def _waiting(result: dict[str, Any]) -> float:
    """Share of wall time after the first batch that the consumer spent inside next()
    (measured by the caller, as the `loop` benchmark does: no library stats needed)."""
    return (result["wait"] - result["first_wait"]) / (result["wall"] - result["ttfb"])


def _step(result: dict[str, Any], records: int, batch: int) -> float:
    """Seconds of training step per batch so the step alone allows `DEMAND` input records/s,
    from a run's input records per output item (a filter keeps ~½, a packed row holds ~4)."""
    return batch * records / result["records"] / DEMAND


@register("stream", "stream mode: filter + batch and pack + batch of text vs plain batch",
          peer="batch control")
def run_stream(args: Any) -> list[Row]:
    n = sizes(args)["text"]
    paths = sharded_dataset(args, "text", n, SHARDS)
    epochs = {name: e[0] if args.quick else e[1] for name, (_, _, e) in PIPELINES.items()}
    specs = {name: _spec(paths, extra, epochs[name])
             for name, (_, extra, _) in PIPELINES.items()}
    names = list(specs)
    log(f"stream: warm-up ({', '.join(names)})")
    stepped = {}
    wait_n = min(n, 10_000 if args.quick else 60_000)
    for name in names:
        warm = run_pipeline(specs[name])
        step = _step(warm, n * epochs[name], specs[name]["batch"])
        stepped[name] = {**specs[name], "epochs": 1, "limit": wait_n, "step": step}
    res: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    waits: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    repeats = reps(args)
    for k in range(repeats):
        log(f"stream: repeat {k + 1}/{repeats}")
        for name in names[k % len(names):] + names[: k % len(names)]:
            gc.collect()
            res[name].append(run_pipeline(specs[name]))
            gc.collect()
            waits[name].append(run_pipeline(stepped[name]))
    label = f"text 1 KiB, {SHARDS} shards of {n // 1000}k records, workers={WORKERS}"
    records = {name: n * epochs[name] for name in names}
    control = _runs(res["batch"], records["batch"])
    rows = []
    for name, (what, _, _) in PIPELINES.items():
        runs = _runs(res[name], records[name])
        outs = statistics.median(r["records"] for r in res[name])
        rows.append(throughput_row(
            f"{label}: {what}", runs, None if name == "batch" else control, 1.0, "rec/s",
            TEXT_BYTES, f"input records/s after the first batch; {epochs[name]} epoch(s) per "
                        f"run, {outs:,.0f} {'rows' if name == 'pack' else 'elements'} out"))
    for name, (what, _, _) in PIPELINES.items():
        rows.append(Row(f"{label}: {what}: parent process CPU per record", "µs/rec",
                        Stats.of(1e6 * r["parent_cpu"] / records[name] for r in res[name]),
                        note="the main process alone (its event-loop thread incl.), whole run"))
    for name, (what, _, _) in PIPELINES.items():
        rows.append(Row(f"{label}: {what}: training loop at {DEMAND // 1000}k input rec/s, "
                        "consumer waiting", "%",
                        Stats.of(100 * _waiting(r) for r in waits[name]),
                        note=f"share of wall time in next() after the first batch; "
                             f"{wait_n // 1000}k records, a sleep of "
                             f"{stepped[name]['step'] * 1e3:.2f} ms after each batch"))
    return rows
