"""`parquet`: the text workload read from Parquet files by aioloader, Grain's
`ParquetIterDataset` and Hugging Face `datasets` (streaming), side by side; then aioloader
from the emulated bucket at 30 ms against the same runs from local files.

- the files: the pipeline benchmarks' 1 KiB JSON records (`common.text_records`), 200k of
  them in 20 files, each row `{"id": int64, "text": the record as a string}`, written by
  pyarrow (snappy, its default) with `--group-rows` rows per row group (default 1000: about
  1 MB per row group, ten per file; pyarrow's own default of 1Mi rows would make each 10 MB
  file a single row group, which no shuffle can mix within a file; with fewer `--rows`, ten
  row groups a file);
- the workload: a global shuffle → `json.loads(row["text"])` → batch 256, one whole epoch,
  each run in a fresh interpreter (`bench_pipeline.run_child`), contenders in turn
  within each repeat (A, B, C, ...), ratios paired per repeat;
- aioloader: `Dataset.from_parquet(paths)`, exact global shuffle (`shuffle(0)`) and block
  shuffle (`strategy="block"`), each the best of workers 0 and 2 per repeat;
- Grain: `ParquetIterDataset` + `WindowShuffleIterDataset(window_size=--shuffle-buffer)`
  (10 000 rows by default), the best of in-process and `mp_prefetch` with 2 workers per
  repeat; Hugging Face: `load_dataset("parquet", streaming=True).shuffle(buffer_size=
  --shuffle-buffer)` (its own default is 1000), skipped when `datasets` is not installed
  (`pip install 'aioloader[bench]'`). Neither peer's buffer is a global shuffle: their
  rates are upper bounds on what they would reach with one;
- the limit: `pq.read_table` of each file + `json.loads` of every row, one thread, no
  shuffle, in records per CPU-second: what one core can do at best;
- the bucket: the 20 files in the local GCS emulator behind a 30 ms delay line (a process of
  its own); aioloader exact and block shuffle from it against the same spec from local
  files, alternating, with the workers that won locally (or `--aio-workers`).

`python -m benchmarks run --only parquet [--quick] [--repeats N] [--rows N] [--group-rows N]
[--shuffle-buffer N]`
"""

from __future__ import annotations

import importlib.util
import os
import statistics
from pathlib import Path
from typing import Any

from .bench_pipeline import SHARDS, TEXT_BYTES, _best_per_repeat, _spec, reps, run_child
from .common import (
    GEN_VERSION,
    GENERATORS,
    Row,
    Runs,
    _records_from_cache,
    data_dir,
    log,
    register,
    throughput_row,
)

WINDOW = 10_000  # the peers' shuffle buffer, in rows
GROUP_ROWS = 1000
LATENCY_MS = 30.0
CHILD_TIMEOUT = 600.0  # seconds for one epoch (HF's takes ~80 s on a loaded 2-core machine)
TARGETS = {"peer": 3.0, "bucket": 0.8}


def settings(args: Any) -> dict[str, int]:
    """Records, rows per row group and the peers' buffer for this run."""
    quick = getattr(args, "quick", False)
    n = getattr(args, "rows", None) or (20_000 if quick else 200_000)
    group = getattr(args, "group_rows", None)
    if group is None:  # ten row groups a file, of at most 1000 rows
        group = max(1, min(GROUP_ROWS, n // SHARDS // 10))
    window = getattr(args, "shuffle_buffer", None) or (WINDOW // 4 if quick else WINDOW)
    return {"n": n, "group_rows": group, "window": window}


def parquet_shards(args: Any, n: int, shards: int, group_rows: int) -> list[Path]:
    """`n` text records as `shards` Parquet files (file k: the records of ArrayRecord shard
    k), columns id (int64) and text (string), `group_rows` rows per row group (0: pyarrow's
    default); cached in the data directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = data_dir(args) / f"text-n{n}-s{shards}-pq-g{group_rows}-v{GEN_VERSION}"
    paths = [folder / f"text-{k:05d}-of-{shards:05d}.parquet" for k in range(shards)]
    if (folder / ".complete").exists():
        return paths
    records = _records_from_cache(args, "text", n) or GENERATORS["text"](n)
    log(f"writing {folder.name}/ ({shards} files)")
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [k * n // shards for k in range(shards + 1)]
    for k, path in enumerate(paths):
        lo, hi = bounds[k], bounds[k + 1]
        table = pa.table({"id": pa.array(range(lo, hi), pa.int64()),
                          "text": pa.array([r.decode() for r in records[lo:hi]], pa.string())})
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp, row_group_size=group_rows or None)
        os.replace(tmp, path)
    (folder / ".complete").touch()
    return paths


def repeats(args: Any) -> int:
    """--repeats, else 3 (2 with --quick): each round is ~8 whole epochs."""
    return reps(args, 3, 2)


def have_hf() -> bool:
    return importlib.util.find_spec("datasets") is not None


def local_specs(paths: list[Path], window: int, hf: bool) -> dict[str, dict[str, Any]]:
    """Every local contender's spec, by name."""
    specs = {
        f"{shuffle}{w}": _spec("aioloader", paths, "decode_parquet_text", format="parquet",
                               shuffle=shuffle, workers=w)
        for shuffle in ("exact", "block") for w in (0, 2)
    }
    for w in (0, 2):
        specs[f"grain{w}"] = _spec("grain-parquet", paths, "", window=window, workers=w)
    if hf:
        specs["hf"] = _spec("hf", paths, "", window=window)
    specs["limit"] = _spec("pyarrow", paths, "")
    return specs


def alternate(specs: dict[str, dict[str, Any]], repeats: int, warmup: tuple[str, ...] = ()
              ) -> dict[str, list[dict[str, Any]]]:
    """Each spec's epoch in a fresh process, in turn within each of `repeats` rounds; a run
    that fails is recorded as {"error": reason}. `warmup` names run once first, untimed."""
    def one(spec: dict[str, Any]) -> dict[str, Any]:
        try:
            return run_child(spec, timeout=CHILD_TIMEOUT)
        except RuntimeError as exc:
            return {"error": str(exc)}

    for name in warmup:
        one(specs[name])
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in specs}
    for k in range(repeats):
        log(f"parquet: round {k + 1} of {repeats}")
        for name, spec in specs.items():
            out[name].append(one(spec))
    return out


# -- pairing --------------------------------------------------------------------------------


def ok(results: list[dict[str, Any]]) -> bool:
    """All of a contender's runs gave figures."""
    return bool(results) and not any("error" in r for r in results)


def runs(results: list[dict[str, Any]]) -> Runs:
    """Seconds per record (wall and CPU) of each run: a throughput row's work is 1 record."""
    return Runs([r["wall"] / r["records"] for r in results],
                [r["cpu"] / r["records"] for r in results])


def best_of(res: dict[str, list[dict[str, Any]]], names: list[str]
            ) -> tuple[list[dict[str, Any]], str]:
    """Per repeat the fastest of `names` that ran without error; which won how often."""
    names = [n for n in names if n in res and ok(res[n])]
    if not names:
        return [], "none ran"
    best, won = _best_per_repeat(res, names)
    return best, ", ".join(f"{n} won {won.count(n)}" for n in names if won.count(n))


def per_cpu_second(results: list[dict[str, Any]]) -> Runs:
    """The limit as a throughput per CPU-second: its CPU seconds stand for the wall."""
    return Runs([r["cpu"] / r["records"] for r in results],
                [r["cpu"] / r["records"] for r in results])


def errors(res: dict[str, list[dict[str, Any]]]) -> str:
    bad = {n: next(r["error"] for r in rs if "error" in r)
           for n, rs in res.items() if any("error" in r for r in rs)}
    return "; ".join(f"{n} failed: {e}" for n, e in bad.items())


# -- the benchmark --------------------------------------------------------------------------


def local_rows(res: dict[str, list[dict[str, Any]]], label: str, hf: bool) -> list[Row]:
    exact, exact_won = best_of(res, ["exact0", "exact2"])
    block, block_won = best_of(res, ["block0", "block2"])
    grain, grain_won = best_of(res, ["grain0", "grain2"])
    peers = {"grain": grain} if grain else {}
    if hf and ok(res.get("hf", [])):
        peers["hf"] = res["hf"]
    rows: list[Row] = []
    if not exact or not peers:
        return [Row(f"{label}: not measured", "", None, note=errors(res) or "no runs")]
    best_peer = [max((p[k] for p in peers.values()), key=lambda r: r["rate"])
                 for k in range(len(exact))]
    target = f"target ≥ {TARGETS['peer']:.0f}×"
    rows.append(throughput_row(
        f"{label}: aioloader exact shuffle ÷ the best peer", runs(exact), runs(best_peer),
        1.0, "rec/s", TEXT_BYTES, f"aioloader {exact_won}; peer per repeat the faster of "
                                  f"{' and '.join(peers)}; {target}"))
    rows.append(throughput_row(
        f"{label}: aioloader exact shuffle ÷ Grain ParquetIterDataset + shuffle buffer",
        runs(exact), runs(grain), 1.0, "rec/s", TEXT_BYTES, f"Grain {grain_won}"))
    if "hf" in peers:
        rows.append(throughput_row(
            f"{label}: aioloader exact shuffle ÷ HF datasets streaming + shuffle buffer",
            runs(exact), runs(peers["hf"]), 1.0, "rec/s", TEXT_BYTES))
    else:
        rows.append(Row(f"{label}: HF datasets streaming", "rec/s", None,
                        note=errors({"hf": res.get("hf", [])}) or "datasets not installed"))
    if block:
        rows.append(throughput_row(
            f"{label}: aioloader block shuffle ÷ the best peer", runs(block),
            runs(best_peer), 1.0, "rec/s", TEXT_BYTES, f"aioloader {block_won}; {target}"))
    if ok(res.get("limit", [])):
        limit = per_cpu_second(res["limit"])
        rows.append(throughput_row(
            f"{label}: the limit, pq.read_table + json.loads, one thread, no shuffle",
            limit, None, 1.0, "rec/CPU-s", TEXT_BYTES))
        for name, got in (("exact", exact), ("block", block)):
            if got:
                rows.append(throughput_row(
                    f"{label}: aioloader {name} shuffle ÷ the limit", runs(got), limit, 1.0,
                    "rec/s", TEXT_BYTES, "rec/s ÷ the limit's rec per CPU-second: how many "
                                         "cores' worth of the bare loop"))
    bad = errors(res)
    if bad:
        rows.append(Row(f"{label}: failures", "", None, note=bad))
    return rows


def bucket_rows(args: Any, paths: list[Path], workers: dict[str, int], label: str
                ) -> list[Row]:
    """aioloader exact and block shuffle from the emulator at 30 ms ÷ the same, local."""
    from aioloader.testing import local_gcs

    rows: list[Row] = []
    with local_gcs(latency_ms=LATENCY_MS, proxy_process=True) as gcs:
        log(f"parquet: uploading {len(paths)} files to the emulated bucket")
        urls = [gcs.upload(p, f"pq/{p.name}") for p in paths]
        specs: dict[str, dict[str, Any]] = {}
        for shuffle in ("exact", "block"):
            w = workers[shuffle]
            common = dict(format="parquet", shuffle=shuffle, workers=w)
            specs[f"{shuffle}-bucket"] = _spec("aioloader", urls, "decode_parquet_text",
                                               storage_options=gcs.storage_options, **common)
            specs[f"{shuffle}-local"] = _spec("aioloader", paths, "decode_parquet_text",
                                              **common)
        log("parquet: aioloader from the bucket at 30 ms vs local, alternating")
        res = alternate(specs, repeats(args))
    for shuffle in ("exact", "block"):
        far, near = res[f"{shuffle}-bucket"], res[f"{shuffle}-local"]
        if not (ok(far) and ok(near)):
            rows.append(Row(f"{label}: {shuffle} shuffle from the bucket", "", None,
                            note=errors({shuffle: far + near})))
            continue
        rows.append(throughput_row(
            f"{label}: aioloader {shuffle} shuffle, emulator at {LATENCY_MS:.0f} ms ÷ local "
            "files", runs(far), runs(near), 1.0, "rec/s", TEXT_BYTES,
            f"workers={workers[shuffle]} both; default io options; target ≥ "
            f"{TARGETS['bucket']}× for block"))
    return rows


def winner(res: dict[str, list[dict[str, Any]]], shuffle: str, pinned: int | None) -> int:
    """The workers count that won the most local repeats for `shuffle` (ties: more workers)."""
    if pinned is not None:
        return pinned
    names = [f"{shuffle}{w}" for w in (0, 2) if ok(res.get(f"{shuffle}{w}", []))]
    if not names:
        return 2
    _, won = _best_per_repeat(res, names)
    return max((0, 2), key=lambda w: (won.count(f"{shuffle}{w}"), w))


@register("parquet", "Parquet text: aioloader vs Grain ParquetIterDataset and HF datasets "
          "streaming, locally and from the bucket", peer="peer")
def run_parquet(args: Any) -> list[Row]:
    s = settings(args)
    paths = parquet_shards(args, s["n"], SHARDS, s["group_rows"])
    hf = have_hf()
    if not hf:
        log("parquet: `datasets` is not installed: the HF rows are skipped")
    specs = local_specs(paths, s["window"], hf)
    group = s["group_rows"] or "pyarrow's default"
    label = (f"text 1 KiB, {SHARDS} Parquet files of {s['n'] // SHARDS:,} rows, "
             f"{group} rows per row group, shuffle → json.loads → batch 256")
    log(f"parquet: {len(specs)} contenders in turn, {repeats(args)} repeats")
    res = alternate(specs, repeats(args), warmup=("limit",))  # (the page cache)
    rows = local_rows(res, f"{label}, local", hf)
    pinned = getattr(args, "aio_workers", None)
    workers = {sh: winner(res, sh, pinned) for sh in ("exact", "block")}
    rows += bucket_rows(args, paths, workers, label)
    rates = {n: statistics.median(r["rate"] for r in rs) for n, rs in res.items() if ok(rs)}
    log("parquet: median rec/s " + ", ".join(f"{n} {v:,.0f}" for n, v in rates.items()))
    return rows

