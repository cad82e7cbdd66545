"""`python -m benchmarks headline`: the headline table at the top of benchmarks/RESULTS.md.

    python -m benchmarks headline [--quick] [--only ROW] [--write] [--json FILE]
    python -m benchmarks headline --from-json benchmarks/headline.json [--write]

Each row runs one headline workload through the existing benchmark code (bench_pipeline's
side-by-side runs and limits, contenders' pipelines, bench_open's fresh-process opens,
bench_scale's bucket runs, the emulator behind the delay line) and keeps: aioloader's figure,
the peer's, aioloader's advantage paired per repeat (median [min–max], > 1 is better), the
ratio to the row's limit where there is one, the command that reruns the row, the commit
measured and the load average sampled while the row ran ("quiet" below `QUIET_PER_CORE` per
core, else "loaded").

`--write` replaces the block between `MARK_START` and `MARK_END` in RESULTS.md (inserted
after the intro, with a "History" heading above the older sections, if the markers are
missing) and saves the run to benchmarks/headline.json; the rest of the file is left as it
is, and writing the same run twice gives the same file. `--from-json` renders a saved run
without measuring again.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import Stats, fmt, log

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
SAVED = HERE / "headline.json"
MARK_START = "<!-- headline:start -->"
MARK_END = "<!-- headline:end -->"
HISTORY = "# History"
WIDTH = 96  # RESULTS.md's prose is wrapped; table rows are not
QUIET_PER_CORE = 1.5  # 1-minute load average per core below which a row counts as quiet


# -- one row ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One row of the headline table (figures as measured; rendering is separate)."""

    key: str  # the --only name that reruns it
    workload: str
    unit: str
    ours: Stats | None
    peer_name: str
    peer: Stats | None
    ratio: Stats | None  # aioloader's advantage over the peer, paired per repeat: > 1 is better
    limit_name: str = ""
    limit: Stats | None = None  # aioloader ÷ the limit (1.0 = at the limit)
    note: str = ""
    command: str = ""
    commit: str = ""
    cores: int = 0
    load: float | None = None  # mean 1-minute load average sampled during the row
    size: str = ""  # "full" or "quick"


def machine_label(cores: int, load: float | None) -> str:
    """"quiet" when the load average per core stayed below `QUIET_PER_CORE`, else "loaded"."""
    if load is None or cores <= 0:
        return f"{cores} cores, load not sampled"
    word = "quiet" if load / cores < QUIET_PER_CORE else "loaded"
    return f"{word} (load {load:.1f}, {cores} cores)"


def stats_of(values: Iterable[float | None]) -> Stats | None:
    """min/median/max of the values that were measured (None when none were)."""
    v = [x for x in values if x is not None]
    return Stats.of(v) if v else None


def paired(ours: Sequence[float | None], theirs: Sequence[float | None],
           cost: bool = False) -> Stats | None:
    """aioloader's advantage per repeat: ours ÷ theirs for rates, theirs ÷ ours for costs
    (`cost`); repeats where either side has no figure are left out."""
    out = []
    for o, t in zip(ours, theirs, strict=False):
        if o and t:
            out.append(t / o if cost else o / t)
    return stats_of(out)


def scaled(s: Stats | None, by: float | None) -> Stats | None:
    if s is None or not by:
        return None
    return Stats(s.min / by, s.median / by, s.max / by)


# -- load sampling ----------------------------------------------------------------------------


class LoadSampler:
    """The 1-minute load average, sampled every `every` s on a thread while the block runs."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        with contextlib.suppress(OSError):
            self.samples.append(os.getloadavg()[0])

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> LoadSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def commit() -> str:
    """The measured tree's short commit, "+dirty" when its tracked files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE.parent), "status", "--porcelain",
                                "--untracked-files=no", "--", "aioloader", "benchmarks",
                                ":!benchmarks/RESULTS.md", ":!benchmarks/headline.json"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


# -- the workloads ----------------------------------------------------------------------------
# Each takes the parsed arguments and returns its lines (without command, commit, machine).


def row_text(args: Any) -> list[Line]:
    """Text pipeline: bench_pipeline's side-by-side run (aioloader best of workers 0/1/2,
    Grain best of threads 1/4, per repeat), and the bare pread + zstd + json loop's 2-core
    ceiling measured in the same run."""
    from . import bench_pipeline as bp
    from .common import sharded_dataset

    n = bp.sizes(args)
    lim = bp.limits(args)
    text20 = sharded_dataset(args, "text", n["text"], bp.SHARDS)
    row, res = bp._side_by_side(args, f"text 1 KiB, {bp.SHARDS} shards, json.loads", text20,
                                "decode_text", bp.TEXT_BYTES, None, lim["ceil_text_json"],
                                "rec/s", bp.reps(args))
    won = res["_won"]
    bp.BEST["aio_workers"] = int(statistics.mode(w["ours"] for w in won)[1:])
    bp.BEST["grain_threads"] = int(statistics.mode(w["peer"] for w in won)[1:])
    return [Line("text", f"text 1 KiB JSON, {n['text'] // 1000}k records in {bp.SHARDS} "
                 "shards, global shuffle, json.loads, batch 256, local", "rec/s",
                 row.ours, "Grain", row.peer, row.ratio,
                 "2 × the bare pread + zstd + json.loads loop",
                 scaled(row.ours, lim["ceil_text_json"]), row.note)]


def row_img(args: Any) -> list[Line]:
    """Images: as `row_text`, against the pread 64K + zstd + one copy ceiling (MB/s)."""
    from . import bench_pipeline as bp
    from .common import sharded_dataset

    n = bp.sizes(args)
    lim = bp.limits(args)
    img20 = sharded_dataset(args, "img", n["img"], bp.SHARDS)
    row, _ = bp._side_by_side(args, f"img 64 KiB, {bp.SHARDS} shards, np.frombuffer.reshape",
                              img20, "decode_image", bp.IMG_BYTES, None, lim["ceil_img_mb"],
                              "MB/s", bp.reps(args))
    mb = bp.IMG_BYTES / 1e6
    return [Line("img", f"img 64 KiB, {n['img'] // 1000}k records in {bp.SHARDS} shards, "
                 "global shuffle, np.frombuffer, batch 256, local", "rec/s", row.ours, "Grain",
                 row.peer, row.ratio, "2 × the bare pread + zstd + copy loop (MB/s)",
                 scaled(scaled(row.ours, 1 / mb), lim["ceil_img_mb"]), row.note)]


def row_first_batch(args: Any) -> list[Line]:
    """Time to the first batch, from building the pipeline (bench_pipeline's `loop` table's
    first part): aioloader with its defaults (workers=0) against Grain's faster of threads
    1 and 4 in each repeat."""
    from . import bench_pipeline as bp
    from .common import sharded_dataset

    n = bp.sizes(args)
    text20 = sharded_dataset(args, "text", n["text"], bp.SHARDS)
    lim = n["ttfb_limit"]
    specs = {"w0": (bp._spec("aioloader", text20, "decode_text", workers=0, limit=lim), False),
             "N1": (bp._spec("grain", text20, "decode_text", threads=1, limit=lim), False),
             "N4": (bp._spec("grain", text20, "decode_text", threads=4, limit=lim), False)}
    log("headline: time to first batch, local")
    res = bp._alternate_specs(specs, bp.reps(args), warmup=tuple(specs))
    ours = [x["ttfb"] for x in res["w0"]]
    theirs = [min(a["ttfb"], b["ttfb"]) for a, b in zip(res["N1"], res["N4"], strict=True)]
    return [Line("first-batch", f"time to first batch, text {bp.SHARDS} shards, json.loads, "
                 "local, from building the pipeline", "s", stats_of(ours),
                 "Grain", stats_of(theirs), paired(ours, theirs, cost=True),
                 note="aioloader workers=0 (the default); Grain the faster of threads 1 and 4 "
                      "per repeat")]


def row_loop(args: Any) -> list[Line]:
    """A training loop with a 10 ms step (bench_pipeline's `loop` table's second part): the
    share of wall time spent waiting for data after the first batch; the limit is the rate
    the step alone allows."""
    from . import bench_pipeline as bp
    from .common import sharded_dataset

    n = bp.sizes(args)
    text20 = sharded_dataset(args, "text", n["text"], bp.SHARDS)
    w, threads = bp.best(args)
    loop = {"limit": n["loop_batches"] * bp.BATCH, "step": bp.STEP}
    specs = {"ours": (bp._spec("aioloader", text20, "decode_text", workers=w, **loop), False),
             "peer": (bp._spec("grain", text20, "decode_text", threads=threads, **loop),
                      False)}
    log(f"headline: training loop, {n['loop_batches']} steps of {bp.STEP * 1e3:.0f} ms")
    res = bp._alternate_specs(specs, bp.reps(args))

    def waiting(x: dict[str, Any]) -> float:
        return 100 * (x["wait"] - x["first_wait"]) / (x["wall"] - x["ttfb"])

    step_rate = bp.BATCH / bp.STEP
    return [Line("loop", f"training loop, {bp.STEP * 1e3:.0f} ms step, {n['loop_batches']} "
                 "steps: % of wall time waiting for data after the first batch", "%",
                 stats_of(waiting(x) for x in res["ours"]), "Grain",
                 stats_of(waiting(x) for x in res["peer"]), None,
                 "the rate the step alone allows",
                 stats_of(x["rate"] / step_rate for x in res["ours"]),
                 f"aioloader workers={w}, Grain threads={threads}; target < 1% waiting")]


def row_open(args: Any) -> list[Line]:
    """Opening one file of many records (group_size 1, 8-byte records), each open in a fresh
    process (bench_open's child: open, len, one record), aioloader without an index cache
    against Grain's ArrayRecordDataSource, rounds in ABBA order."""
    from . import bench_open as bo
    from .common import data_dir

    records = 1_000_000 if args.quick else bo.RECORDS
    folder = data_dir(args) / f"open-one-{records}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "part-00000.array_record"
    if not path.exists():
        log(f"headline: writing {path.name} ({records:,} records)")
        bo._write(path, records)
    specs: dict[str, dict[str, Any]] = {"aio": {"lib": "aio", "paths": str(path)},
             "grain": {"lib": "grain", "paths": [str(path)]}}
    for spec in specs.values():  # page cache, imports compiled
        bo.run_child(sys.executable, None, spec)
    res: dict[str, list[dict[str, Any]]] = {k: [] for k in specs}
    rounds = 3 if args.quick else 5
    log(f"headline: opening {records:,} records, {rounds} rounds")
    for r in range(rounds):
        for name in (list(specs) if r % 2 == 0 else list(specs)[::-1]):
            out = bo.run_child(sys.executable, None, specs[name])
            if "error" in out:
                raise RuntimeError(f"open ({name}) failed: {out['error']}")
            res[name].append(out)
    ours = [x["wall"] for x in res["aio"]]
    theirs = [x["wall"] for x in res["grain"]]
    cpu = paired([x["cpu"] for x in res["aio"]], [x["cpu"] for x in res["grain"]], cost=True)
    return [Line("open", f"open one file of {records / 1e6:g}M records (group_size 1), len "
                 "and one read, fresh process, local", "s", stats_of(ours), "Grain",
                 stats_of(theirs), paired(ours, theirs, cost=True),
                 note="aioloader cold (no index cache); per CPU-second "
                      + ("—" if cpu is None else f"{cpu.median:.2f}×"))]


def row_bucket(args: Any) -> list[Line]:
    """From the emulated bucket (fake-gcs-server behind the delay line at 30 ms + 10 ms
    jitter, in a child process): aioloader record by record (resident_bytes=0,
    io_concurrency=256) against Grain's own gs:// reader (threads=16, in a child), the first
    batches including opening, limited by the raw client's range GETs/s at 256 in flight;
    and aioloader's defaults over one epoch (the dataset kept in memory) against Grain's
    epoch at its measured rate (bench_pipeline's cloud table's rows)."""
    from aioloader.testing import local_gcs

    from . import bench_pipeline as bp
    from .common import sharded_dataset

    n = bp.sizes(args)
    nb = n["cloud_batches"]
    text20 = sharded_dataset(args, "text", n["text"], bp.SHARDS)
    where = "30 ms + 10 ms jitter"
    with local_gcs(latency_ms=30.0, jitter_ms=10.0, proxy_process=True) as gcs:
        log(f"headline: bucket {where}: uploading {len(text20)} text shards")
        urls = bp._upload(gcs, text20, "text")
        opts = gcs.storage_options
        ranges = bp._record_ranges(urls, opts, nb * bp.BATCH)

        def aio(conc: int | None, **kw: Any) -> dict[str, Any]:
            return bp._spec("aioloader", urls, "decode_text", **{
                "workers": 1, "io_concurrency": conc, "storage_options": opts,
                "max_batches": nb, "api": "async", "resident_bytes": 0, **kw})

        grain_spec = bp._spec("grain", urls, "decode_text", threads=16, max_batches=nb)
        bp.run_pipeline(aio(256, max_batches=2))  # warm-up: connections, imports
        res: dict[str, list[dict[str, Any]]] = {"aio": [], "grain": [], "raw": []}
        log(f"headline: bucket {where}: aioloader, Grain gs:// (child), raw client")
        for _ in range(bp.reps(args, 3, 2)):
            res["aio"].append(bp._one(aio(256), False))
            res["grain"].append(bp._one(grain_spec, True))
            res["raw"].append(bp.raw_client(gcs, ranges, 256))
        grain_ok = [r for r in res["grain"] if "error" not in r]
        if len(grain_ok) < len(res["grain"]):
            log(f"headline: Grain failed: {res['grain'][0].get('error', '?')}")
        label = f"text 1 KiB from the emulator, {where}, {bp.SHARDS} shards, json.loads"
        ours = [r["rate"] for r in res["aio"]]
        theirs = [r.get("rate") for r in res["grain"]]
        record = Line("bucket", f"{label}, record by record, first {nb} batches incl. opening",
                      "rec/s", stats_of(ours), "Grain gs://", stats_of(theirs),
                      paired(ours, theirs),
                      "the raw client's GETs/s at 256 in flight (one record per GET; "
                      "aioloader merges neighbouring reads)",
                      paired(ours, [r["rate"] for r in res["raw"]]),
                      "aioloader io_concurrency=256, workers=1, resident_bytes=0; Grain's "
                      "array_record gs:// client, threads=16")
        kept = bp._kept_in_memory_rows(aio, res["grain"], label, args)[0]
    epoch = Line("bucket", f"{label}, one epoch of {n['text'] // 1000}k with the defaults "
                 "(dataset kept in memory)", "rec/s", kept.ours, "Grain gs://", kept.peer,
                 kept.ratio, note="aioloader best of workers 1/2, opening and fetching incl.; "
                 "Grain's epoch = its first batch, then its measured steady rate")
    return [record, epoch]


def row_disk_tier(args: Any) -> list[Line]:
    """A bucket dataset ≥ 4× resident_bytes, exact shuffle, with the disk tier (bench_scale's
    runs: emulator behind the delay line at 30 ± 10 ms, workers=2, rates after the first
    batch, fresh processes): epoch 1 against reading record by record, epoch 2 against the
    same pipeline on local disk."""
    from . import bench_scale as bs

    ns = argparse.Namespace(**{**vars(args), "scale_only": ("local", "record", "disk")})
    bs.measure(ns)
    run = bs.LAST_RUN
    n, res = run["records"], run["res"]
    local = [bs._rate(r, n) for r in res["local"]]
    record = [bs._rate(r, n) for r in res["record"]]
    e1 = [bs._rate(r, n, 1) for r in res["disk"]]
    e2 = [bs._rate(r, n, 2) for r in res["disk"]]
    what = (f"{n // 1000}k × 1 KiB JSON, 20 shards, {run['file_bytes'] / 1e6:.0f} MB = "
            f"{run['file_bytes'] / run['resident']:.1f}× resident_bytes")
    return [
        Line("disk-tier", f"gs:// 30 ± 10 ms, exact shuffle + disk tier, epoch 1 ({what})",
             "rec/s", stats_of(e1), "record by record (aioloader, no tier)", stats_of(record),
             paired(e1, record), "local disk, same pipeline", paired(e1, local),
             f"fresh cache_dir; record by record capped at {run['cap_s']:.0f} s; workers=2"),
        Line("disk-tier", "gs:// 30 ± 10 ms, exact shuffle + disk tier, epoch 2 (cache filled)",
             "rec/s", stats_of(e2), "local disk, same pipeline", stats_of(local),
             paired(e2, local), "local disk, same pipeline", paired(e2, local),
             "the peer is the limit here: local disk"),
    ]


ROWS: dict[str, Callable[[Any], list[Line]]] = {
    "text": row_text,
    "img": row_img,
    "first-batch": row_first_batch,
    "open": row_open,
    "bucket": row_bucket,
    "disk-tier": row_disk_tier,
    "loop": row_loop,
}


def rerun_command(key: str, args: Any) -> str:
    cmd = "python -m benchmarks headline --only " + key + (" --quick" if args.quick else "")
    if key == "loop":
        for flag in ("aio_workers", "grain_threads"):
            if getattr(args, flag, None) is not None:
                cmd += f" --{flag.replace('_', '-')} {getattr(args, flag)}"
    return cmd


def measure(args: Any) -> list[Line]:
    """Run the chosen rows in order, each with its command, commit and load average."""
    lines: list[Line] = []
    head = commit()
    for key in args.only or list(ROWS):
        log(f"headline: {key}")
        with LoadSampler() as load:
            try:
                got = ROWS[key](args)
            except Exception as exc:  # one row failing leaves the others' figures
                log(f"headline: {key} failed: {exc!r}")
                got = [Line(key, key, "", None, "", None, None, note=f"failed: {exc}")]
        for line in got:
            lines.append(dataclasses.replace(
                line, command=rerun_command(key, args), commit=head, cores=cores(),
                load=load.mean, size="quick" if args.quick else "full"))
    return lines


# -- saving and reading runs ------------------------------------------------------------------


def to_json(lines: Sequence[Line], meta: dict[str, Any]) -> str:
    return json.dumps({"meta": meta, "rows": [dataclasses.asdict(x) for x in lines]},
                      indent=1, ensure_ascii=False) + "\n"


def _stats(d: Any) -> Stats | None:
    return None if d is None else Stats(float(d["min"]), float(d["median"]), float(d["max"]))


def from_json(text: str) -> tuple[list[Line], dict[str, Any]]:
    """The lines and meta of a run saved by `to_json`."""
    data = json.loads(text)
    fields = {f.name for f in dataclasses.fields(Line)}
    stats = {"ours", "peer", "ratio", "limit"}
    lines = []
    for row in data["rows"]:
        kw: dict[str, Any] = {k: (_stats(v) if k in stats else v) for k, v in row.items()
                              if k in fields}
        lines.append(Line(**kw))
    return lines, data.get("meta", {})


# -- rendering --------------------------------------------------------------------------------


def _figure(s: Stats | None, unit: str) -> str:
    if s is None:
        return "—"
    if unit == "%":
        return f"{s.median:.2f}% [{s.min:.2f}–{s.max:.2f}]"
    if unit == "s":
        return f"{s.median:.3f} s [{s.min:.3f}–{s.max:.3f}]"
    return f"{fmt(s.median)} {unit} [{fmt(s.min)}–{fmt(s.max)}]"


def _ratio(s: Stats | None, bold: bool = True) -> str:
    if s is None:
        return "—"
    med = f"{s.median:.2f}×"
    return f"{'**' + med + '**' if bold else med} [{s.min:.2f}–{s.max:.2f}]"


def runs_of(lines: Sequence[Line], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs behind `lines`: [{"command", "date", "keys"}], oldest first (a run saved
    before runs were listed counts as one run of all its rows)."""
    if "runs" in meta:
        return list(meta["runs"])
    return [{"command": meta.get("command", "?"), "date": meta.get("date", "?"),
             "keys": list(dict.fromkeys(x.key for x in lines))}]


def _runs_text(lines: Sequence[Line], meta: dict[str, Any]) -> str:
    runs = runs_of(lines, meta)
    parts = [f"`{r['command']}` ({r['date']}; rows: {', '.join(r['keys'])})" for r in runs]
    return ("This run: " if len(parts) == 1 else "Rows from these runs: ") + "; ".join(parts) + "."


def render(lines: Sequence[Line], meta: dict[str, Any]) -> str:
    """The markdown block written between the markers (the markers included)."""
    sizes = sorted({x.size for x in lines if x.size})
    size = " and ".join(sizes) or "unknown"
    warn = ("" if sizes == ["full"] else
            " **Quick rows are a smoke test (small datasets, fewer repeats), not claims.**")
    intro = (
        "Regenerated by `python -m benchmarks headline --write` (`make bench-headline`; "
        "`--quick` for a smoke test, `--only ROW` for one row, `--from-json "
        f"benchmarks/{SAVED.name}` to render the saved run again). "
        f"{_runs_text(lines, meta)} Size: {size}.{warn} "
        "Every ratio is aioloader's advantage paired per repeat, median [min–max]: "
        "aioloader ÷ peer for rates, peer ÷ aioloader for seconds, so > 1 is better; "
        "\"ratio to the limit\" is aioloader ÷ the limit named in the row. Machine: "
        f"{meta.get('machine', '?')}. \"quiet\" means the 1-minute load average sampled "
        f"while the row ran stayed below {QUIET_PER_CORE} per core. Absolute figures drift "
        "±25% between runs on these shared machines: read the ratios. Figures elsewhere in "
        "the README and the docs come from this table; the sections under "
        "[History](#history) are the dated runs behind them.")
    out = [
        MARK_START,
        "## Headline",
        "",
        textwrap.fill(intro, WIDTH, break_on_hyphens=False, break_long_words=False),
        "",
        "| workload | aioloader | peer | ratio [min–max] | ratio to the limit | command to "
        "rerun | commit | machine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in lines:
        peer = "—" if x.peer is None and not x.peer_name else \
            f"{x.peer_name}: {_figure(x.peer, x.unit)}"
        limit = "—" if x.limit is None else f"{_ratio(x.limit, bold=False)} of {x.limit_name}"
        workload = x.workload + (" (**--quick**: not a claim)" if x.size == "quick" else "")
        out.append(f"| {workload} | {_figure(x.ours, x.unit)} | {peer} | {_ratio(x.ratio)} "
                   f"| {limit} | `{x.command}` | {x.commit} | {machine_label(x.cores, x.load)} |")
    notes = [textwrap.fill(f"- {x.workload}: {x.note}", WIDTH, subsequent_indent="  ",
                           break_on_hyphens=False, break_long_words=False)
             for x in lines if x.note]
    if notes:
        out += ["", "Configurations:", "", *notes]
    out.append(MARK_END)
    return "\n".join(out)


def replace_block(text: str, block: str) -> str:
    """`text` with the headline block replaced by `block`; if it has none, `block` goes after
    the intro (before the first `## ` section) with the `HISTORY` heading after it, so the
    older sections sit under it unchanged."""
    start, end = text.find(MARK_START), text.find(MARK_END)
    if start >= 0 and end > start:
        return text[:start] + block + text[end + len(MARK_END):]
    if start >= 0 or end >= 0:
        raise ValueError(f"RESULTS.md has one of {MARK_START} / {MARK_END} but not both")
    lines = text.splitlines(keepends=True)
    at = next((i for i, ln in enumerate(lines)
               if ln.startswith("## ") or ln.rstrip() == HISTORY), len(lines))
    has_history = any(ln.rstrip() == HISTORY for ln in lines)
    head = "".join(lines[:at])
    if head and not head.endswith("\n\n"):
        head += "\n" if head.endswith("\n") else "\n\n"
    middle = block + "\n\n" + ("" if has_history else HISTORY + "\n\n")
    return head + middle + "".join(lines[at:])


# -- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="small datasets and fewer repeats (minutes): a smoke test")
    parser.add_argument("--only", action="append", choices=list(ROWS), metavar="ROW",
                        help=f"run only this row (repeatable); one of: {', '.join(ROWS)}")
    parser.add_argument("--write", action="store_true",
                        help=f"replace the headline block in {RESULTS.name} and save the run "
                             f"beside it ({SAVED.name}); with --only, the other rows are kept "
                             "from the saved run")
    parser.add_argument("--from-json", type=Path, action="append", default=None,
                        metavar="FILE",
                        help="render a saved run (no measuring); repeatable: a later file's "
                             "rows replace an earlier one's")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="also save the run to FILE")
    parser.add_argument("--results", type=Path, default=RESULTS, metavar="FILE",
                        help="the file --write updates (default benchmarks/RESULTS.md)")
    parser.add_argument("--repeats", type=int, default=None, metavar="N",
                        help="timed repeats per row (default: each benchmark's own)")
    parser.add_argument("--aio-workers", type=int, default=None, metavar="W",
                        help="aioloader's workers in the loop row (default: the text row's "
                             "winner in the same run, else 1)")
    parser.add_argument("--grain-threads", type=int, default=None, metavar="N",
                        help="Grain's threads in the loop row (default: the text row's winner "
                             "in the same run, else 1)")
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="where generated datasets are cached (default benchmarks/data)")


def merge(saved: Sequence[Line], new: Sequence[Line]) -> list[Line]:
    """`saved` with the rows of every key in `new` replaced by `new`'s, in `ROWS` order (a
    rerun of some rows keeps the others' figures)."""
    keys = {x.key for x in new}
    rows = [x for x in saved if x.key not in keys] + list(new)
    order = {k: i for i, k in enumerate(ROWS)}
    return sorted(rows, key=lambda x: order.get(x.key, len(order)))  # stable within a key


def merge_runs(saved: tuple[Sequence[Line], dict[str, Any]],
               new: tuple[Sequence[Line], dict[str, Any]]) -> tuple[list[Line], dict[str, Any]]:
    """`merge` of the rows, and of the runs behind them: a saved run keeps the keys `new`
    did not rerun (and is dropped when none is left); the machine line is `new`'s."""
    keys = {x.key for x in new[0]}
    runs = []
    for r in runs_of(*saved):
        left = [k for k in r["keys"] if k not in keys]
        if left:
            runs.append({**r, "keys": left})
    meta = {"machine": new[1].get("machine", saved[1].get("machine", "?")),
            "runs": runs + runs_of(*new)}
    return merge(saved[0], new[0]), meta


def run(args: Any, argv: Sequence[str]) -> int:
    from .common import machine_info

    saved = args.results.parent / SAVED.name  # the run saved beside the file it renders into
    if args.from_json:
        lines: list[Line] = []
        meta: dict[str, Any] = {"runs": []}
        for path in args.from_json:  # later files' rows replace earlier ones'
            lines, meta = merge_runs((lines, meta), from_json(path.read_text()))
        if args.only:
            lines = [x for x in lines if x.key in args.only]
    else:
        if args.repeats is not None and args.repeats < 1:
            raise SystemExit("--repeats must be at least 1")
        start = time.perf_counter()
        now = datetime.datetime.now(datetime.timezone.utc)
        lines = measure(args)
        meta = {"machine": machine_info(), "runs": [{
            "command": "python -m benchmarks " + shlex.join(argv),
            "date": now.strftime("%Y-%m-%d %H:%M UTC"),
            "keys": list(dict.fromkeys(x.key for x in lines))}]}
        log(f"headline: done in {time.perf_counter() - start:.0f} s")
        if args.write and args.only and saved.exists():  # the other rows as saved
            lines, meta = merge_runs(from_json(saved.read_text()), (lines, meta))
    block = render(lines, meta)
    print(block, flush=True)
    if args.json:
        args.json.write_text(to_json(lines, meta))
    if args.write:
        saved.write_text(to_json(lines, meta))
        args.results.write_text(replace_block(args.results.read_text(), block))
        log(f"headline: written to {args.results}")
    return 0
