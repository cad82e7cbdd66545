"""Shared benchmark machinery: registry, cached datasets, alternating timers, tables.

The protocol (see /work/shared/BENCHMARKS.md): absolute figures on these shared 2-core machines
drift by ±25% from run to run, so every claim is a ratio aioloader ÷ peer measured side by side
in one run, on the same files. Within each repeat the contenders run in turn (A, B, A, B, ...)
so drift hits both; the ratio is taken per repeat and reported as min/median/max.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path
from typing import Any

import numpy as np

# -- registry -------------------------------------------------------------------------------

#: Modules that register benchmarks when imported; later workloads append theirs here.
MODULES = ("benchmarks.bench_format", "benchmarks.bench_pipeline", "benchmarks.bench_verify",
           "benchmarks.bench_stream", "benchmarks.bench_decode", "benchmarks.bench_tier",
           "benchmarks.bench_autotune", "benchmarks.bench_formats",
           "benchmarks.bench_contention", "benchmarks.bench_parquet")


@dataclass(frozen=True)
class Benchmark:
    name: str
    description: str
    peer: str  # what aioloader is compared with, for the table header
    run: Callable[[Any], list[Row]]  # run(args) -> rows


REGISTRY: dict[str, Benchmark] = {}


def register(name: str, description: str, peer: str):
    """Decorator: add `fn(args) -> list[Row]` to the registry under `name`."""

    def deco(fn: Callable[[Any], list[Row]]):
        REGISTRY[name] = Benchmark(name, description, peer, fn)
        return fn

    return deco


def load_all() -> dict[str, Benchmark]:
    for module in MODULES:
        import_module(module)
    return REGISTRY


# -- compatibility --------------------------------------------------------------------------


def new_event_loop() -> Any:
    """aioloader's event loop (uvloop when installed).

    Newer trees hold it in `aioloader.io.sync`, older ones in `aioloader.aioutil`; asking both lets
    one copy of the benchmarks measure either tree (`benchmarks/compare_trees.py`)."""
    try:
        from aioloader.io.sync import new_event_loop as make
    except ImportError:
        from aioloader.aioutil import new_event_loop as make
    return make()


# -- progress -------------------------------------------------------------------------------

_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress to stderr, so stdout holds only the tables."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- datasets -------------------------------------------------------------------------------

DEFAULT_DATA_DIR = Path(__file__).resolve().parent / "data"
GEN_VERSION = 1  # bump when a generator changes, so cached files are rebuilt

TEXT_SIZE = 1024
IMAGE_SHAPE = (128, 128, 4)  # 64 KiB of uint8


def data_dir(args: Any = None) -> Path:
    path = Path(getattr(args, "data_dir", None) or DEFAULT_DATA_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def text_records(n: int, seed: int = 0) -> list[bytes]:
    """`n` JSON objects of exactly 1 KiB each: Zipf-distributed pseudo-words (text-like, zstd
    gets ~1.7x), valid JSON so pipeline benchmarks can `json.loads` them."""
    rng = np.random.default_rng(seed)
    vocab = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 11)))
             for _ in range(5000)]
    weights = 1.0 / (np.arange(len(vocab)) + 2.7)  # Zipf-Mandelbrot, like word frequencies
    ranks = rng.choice(len(vocab), 400_000, p=weights / weights.sum())
    corpus = " ".join(vocab[r] for r in ranks)
    starts = rng.integers(0, len(corpus) - 2 * TEXT_SIZE, n)
    out = []
    for i, s in enumerate(starts.tolist()):
        fields = {"id": i, "label": s % 1000, "title": corpus[s + 1100 : s + 1160],
                  "body": corpus[s : s + TEXT_SIZE]}
        rec = json.dumps(fields, separators=(",", ":"))
        fields["body"] = fields["body"][: TEXT_SIZE - len(rec)]  # ASCII: 1 char = 1 byte
        out.append(json.dumps(fields, separators=(",", ":")).encode())
    return out


def image_records(n: int, seed: int = 0) -> list[bytes]:
    """`n` raw 128x128x4 uint8 images: a smooth gradient under strong noise, so zstd gains
    little (like already-compressed or natural image data)."""
    rng = np.random.default_rng(seed)
    h, w, c = IMAGE_SHAPE
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for _ in range(n):
        a, b = rng.integers(0, 4, 2).tolist()
        p = int(rng.integers(0, 256))
        base = ((a * yy + b * xx + p) % 256).astype(np.uint8)[..., None]
        noise = rng.integers(0, 96, (h, w, c), dtype=np.uint8)
        out.append((base + noise).tobytes())
    return out


GENERATORS: dict[str, Callable[[int], list[bytes]]] = {
    "text": text_records,
    "img": image_records,
}


def dataset(args: Any, kind: str, n: int, group_size: int = 1,
            options: str = "zstd:3") -> Path:
    """A cached ArrayRecord file of `n` `kind` records written by array_record's own writer
    (`group_size:G,<options>`), so both readers see exactly the files users have."""
    from array_record.python.array_record_module import ArrayRecordWriter

    tag = options.replace(":", "").replace(",", "-")
    path = data_dir(args) / f"{kind}-n{n}-g{group_size}-{tag}-v{GEN_VERSION}.array_record"
    if path.exists():
        return path
    records = _records_from_cache(args, kind, n) or GENERATORS[kind](n)
    log(f"writing {path.name}")
    tmp = path.with_suffix(".tmp")
    writer = ArrayRecordWriter(str(tmp), f"group_size:{group_size},{options}")
    for r in records:
        writer.write(r)
    writer.close()
    os.replace(tmp, path)
    return path


def sharded_dataset(args: Any, kind: str, n: int, shards: int, group_size: int = 1,
                    options: str = "zstd:3") -> list[Path]:
    """`n` `kind` records cut into `shards` consecutive files (shard k holds records
    [k*n/shards, (k+1)*n/shards)), written by array_record's writer; cached like `dataset`."""
    from array_record.python.array_record_module import ArrayRecordWriter

    tag = options.replace(":", "").replace(",", "-")
    folder = data_dir(args) / f"{kind}-n{n}-s{shards}-g{group_size}-{tag}-v{GEN_VERSION}"
    paths = [folder / f"{kind}-{k:05d}-of-{shards:05d}.array_record" for k in range(shards)]
    if (folder / ".complete").exists():
        return paths
    records = _records_from_cache(args, kind, n) or GENERATORS[kind](n)
    log(f"writing {folder.name}/ ({shards} shards)")
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [k * n // shards for k in range(shards + 1)]
    for k, path in enumerate(paths):
        tmp = path.with_suffix(".tmp")
        writer = ArrayRecordWriter(str(tmp), f"group_size:{group_size},{options}")
        for r in records[bounds[k] : bounds[k + 1]]:
            writer.write(r)
        writer.close()
        os.replace(tmp, path)
    (folder / ".complete").touch()
    return paths


def _records_from_cache(args: Any, kind: str, n: int) -> list[bytes] | None:
    from array_record.python.array_record_module import ArrayRecordReader

    for p in sorted(data_dir(args).glob(f"{kind}-n{n}-g*-v{GEN_VERSION}.array_record")):
        reader = ArrayRecordReader(str(p))
        try:
            return list(reader.read_all())
        finally:
            reader.close()
    return None


def load_records(args: Any, kind: str, n: int) -> list[bytes]:
    """The records of a dataset (read back from the cached file: faster than regenerating)."""
    dataset(args, kind, n)
    records = _records_from_cache(args, kind, n)
    assert records is not None
    return records


# -- timing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Stats:
        v = sorted(values)
        return cls(v[0], statistics.median(v), v[-1])


@dataclass
class Runs:
    """Wall and CPU (process) seconds of each timed call of one contender."""

    wall: list[float]
    cpu: list[float]

    @property
    def cores(self) -> float:
        """Median CPU ÷ wall: how many cores the contender kept busy (threads show here)."""
        return statistics.median(c / w for c, w in zip(self.cpu, self.wall, strict=True))


def cpu_seconds() -> float:
    """CPU seconds of this process, its children that exited and were reaped, and every live
    multiprocessing descendant with what it reaped (worker processes and child interpreters
    count against the contender that started them).

    Live descendants matter because workers forked by a forkserver are its children, not
    ours: their time reaches us only while they run. Take the closing sample while a loader's
    workers are still alive.
    """
    import psutil

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = time.process_time() + kids.ru_utime + kids.ru_stime
    for p in psutil.Process().children(recursive=True):
        try:  # multiprocessing's processes only: not the emulator or the delay line
            if "multiprocessing" not in " ".join(p.cmdline()):
                continue
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    gc.collect()
    cpu, wall = cpu_seconds(), time.perf_counter()
    result = fn()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    del result  # freed outside the timed region
    return wall, cpu


def alternate(fns: Mapping[str, Callable[[], object]], repeats: int,
              warmup: int = 1) -> dict[str, Runs]:
    """Time each fn `repeats` times, running them in turn within every repeat (A, B, A, B...).

    `warmup` untimed rounds first (page cache, allocator, lazily built indexes)."""
    for _ in range(warmup):
        for fn in fns.values():
            _timed(fn)
    runs = {name: Runs([], []) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = _timed(fn)
            runs[name].wall.append(wall)
            runs[name].cpu.append(cpu)
    return runs


def measure(fn: Callable[[], object], repeats: int, warmup: int = 1) -> Stats:
    """min/median/max seconds per call of `fn` over `repeats` timed calls."""
    return Stats.of(alternate({"fn": fn}, repeats, warmup)["fn"].wall)


def repeats(args: Any) -> int:
    if getattr(args, "repeats", None):
        return args.repeats
    return 3 if getattr(args, "quick", False) else 7


# -- rows and tables ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of a table: figures per repeat already in `unit`."""

    workload: str
    unit: str
    ours: Stats | None
    peer: Stats | None = None
    ratio: Stats | None = None  # aioloader's advantage, paired per repeat: > 1 is better
    mb: tuple[float, float | None] | None = None  # MB/s medians (ours, peer)
    cores: tuple[float, float | None] | None = None  # CPU ÷ wall medians (ours, peer)
    cpu_ratio: Stats | None = None  # the same ratio per CPU-second, paired per repeat
    note: str = ""


def throughput_row(workload: str, ours: Runs, peer: Runs | None, work: float, unit: str,
                   mb_per_work: float | None = None, note: str = "") -> Row:
    """A row from timed runs: throughput = work / seconds, the ratio paired per repeat."""
    mine = [work / t for t in ours.wall]
    theirs = [work / t for t in peer.wall] if peer is not None else None
    ratio = Stats.of(o / p for o, p in zip(mine, theirs, strict=True)) if theirs else None
    mb = None
    if mb_per_work is not None:
        mb = (statistics.median(mine) * mb_per_work / 1e6,
              statistics.median(theirs) * mb_per_work / 1e6 if theirs else None)
    cores = (ours.cores, peer.cores if peer is not None else None)
    cpu_ratio = (Stats.of(p / o for o, p in zip(ours.cpu, peer.cpu, strict=True))
                 if peer is not None else None)
    return Row(workload, unit, Stats.of(mine), Stats.of(theirs) if theirs else None, ratio,
               mb, cores, cpu_ratio, note)


def fmt(x: float | None) -> str:
    """Three significant digits with k/M suffixes."""
    if x is None:
        return "—"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _cell(s: Stats | None, ratio: bool = False) -> str:
    if s is None:
        return "—"
    if ratio:
        return f"**{s.median:.2f}×** [{s.min:.2f}–{s.max:.2f}]"
    return f"{fmt(s.median)} [{fmt(s.min)}–{fmt(s.max)}]"


def format_table(bench: Benchmark, rows: Sequence[Row]) -> str:
    """A markdown table: medians with [min–max] over repeats, and the paired ratios (wall
    clock, and per CPU-second, which discounts the peer's helper threads).

    The ratio column is aioloader's advantage: aioloader ÷ peer for throughputs, peer ÷
    aioloader for costs (seconds, bytes); > 1 means aioloader is better either way."""
    peer = bench.peer
    lines = [
        f"### {bench.name}: {bench.description}",
        "",
        f"| workload | unit | aioloader | {peer} | MB/s aioloader / {peer} "
        f"| cores busy aioloader / {peer} | aioloader vs {peer} (× better) | per CPU-second |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mb = "—" if r.mb is None else f"{fmt(r.mb[0])} / {fmt(r.mb[1])}"
        cores = "—" if r.cores is None else " / ".join(
            "—" if c is None else f"{c:.2f}" for c in r.cores)
        workload = f"{r.workload} ({r.note})" if r.note else r.workload
        per_cpu = "—" if r.cpu_ratio is None else f"{r.cpu_ratio.median:.2f}×"
        lines.append(f"| {workload} | {r.unit} | {_cell(r.ours)} | {_cell(r.peer)} | {mb} "
                     f"| {cores} | {_cell(r.ratio, ratio=True)} | {per_cpu} |")
    return "\n".join(lines)


# -- machine --------------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> str:
    """One line: CPU, cores, memory, Python and the versions that matter for the figures."""
    from aioloader.arrayrecord import hashing

    # The implementation in use ("avx2", "portable"); older trees only say whether it is native.
    native = getattr(hashing, "NATIVE_IMPL", hashing.HAVE_NATIVE)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import psutil

        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        mem = ""
    return (
        f"{cpu_model()}, {cores} cores{mem}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}; numpy {np.__version__}, "
        f"zstandard {_version('zstandard')}, array-record {_version('array-record')}, "
        f"grain {_version('grain')}; native highwayhash: {native}"
    )


def aioloader_info() -> str:
    """Where the measured aioloader was imported from, and its git commit if it is a checkout:
    which tree a table measured (`benchmarks/compare_trees.py` runs one copy against two)."""
    import subprocess

    import aioloader

    root = Path(aioloader.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{root}" + (f" (commit {commit})" if commit else "")
