"""Cliffs, before/after in one sitting: big batches, the first batch of a fresh process
(ours against Grain's), and large groups under a shuffle.

    python benchmarks/bench_big.py big --before /work/wt-base --after . --rounds 3
    python benchmarks/bench_big.py first --before /work/wt-base --after . --rounds 5
    python benchmarks/bench_big.py groups --before /work/wt-base --after . --rounds 2 \
        --records 50000,200000,1000000 --shuffles exact,block
    python benchmarks/bench_big.py groups --after . --rounds 2 --records 1000000 \
        --shuffles exact --workers 0 --budgets 512,1024,2048,4096

Every measurement is its own fresh `python` process (`child`), run against a tree by
`PYTHONPATH=<copy of these benchmarks>:<tree>`; the trees alternate ABBA. `big`: 1 MiB records
and 224x224x3 uint8 images, batch 256, workers 0/1/2: records/s after the first batch, time to
the first batch, peak memory (the sum over the parent and its workers of VmHWM, which
counts shared pages once per process that touched them, and the peak of the sampled sum of
PSS, which counts them once), and CPU per record (parent and workers, the whole run: a
steadier figure than rates on a shared machine; multiprocessing's forkserver and resource
tracker not counted); `--breakdown` splits the peak PSS by process and by kind (the arena's
shared memory, heap, anonymous maps, files). `first`: the time from building the pipeline
to the first batch in hand (and the import before it), 20 shards of 1 KiB JSON, batch 256.
`groups`: one file of N 1 KiB JSON records written with group_size 65536, `json.loads`, batch
256, one full epoch (but the last batch) under an exact or a block shuffle, workers 0/1/2: the
same figures, the multi-record chunks the run decoded (`decoded`) and the horizons an
epoch needed (`horizons`: 0 when the exact shuffle took no stash), and what the spill of
decoded records held and served (`spill_mb`, `spill_hits`: fills that read it instead of
decoding); `--budgets` runs each at several `memory_budget`s (the cost of an exact shuffle as
records ÷ memory_budget grows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MIB_RECORDS = 1024  # 1 GiB
IMG_RECORDS = 4096  # 224x224x3: 616 MB
IMG224 = (224, 224, 3)


# -- transforms (module level: workers import them by name) -----------------------------------


def as_bytes_array(record: bytes) -> np.ndarray:
    """A zero-copy uint8 view of a record."""
    return np.frombuffer(record, dtype=np.uint8)


def as_image224(record: bytes) -> np.ndarray:
    return np.frombuffer(record, dtype=np.uint8).reshape(IMG224)


def decode_text(record: bytes) -> dict:
    return json.loads(record)


# -- data -----------------------------------------------------------------------------------


def write(path: Path, records) -> Path:
    from array_record.python.array_record_module import ArrayRecordWriter

    if path.exists():
        return path
    tmp = path.with_suffix(".tmp")
    w = ArrayRecordWriter(str(tmp), "group_size:1,zstd:1")
    for r in records:
        w.write(r)
    w.close()
    os.replace(tmp, path)
    return path


def big_data(folder: Path) -> dict[str, list[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    mib = write(folder / "mib-1024.array_record",
                (rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
                 for _ in range(MIB_RECORDS)))
    n = int(np.prod(IMG224))
    img = write(folder / "img224-4096.array_record",
                (rng.integers(0, 256, n, dtype=np.uint8).tobytes() for _ in range(IMG_RECORDS)))
    return {"mib": [str(mib)], "img": [str(img)]}


def group_file(folder: Path, n: int, group: int = 65536) -> str:
    """One file of `n` 1 KiB JSON records (`common.text_records`, made 100k at a time)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from .common import text_records

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"text-{n}-g{group}.array_record"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        w = ArrayRecordWriter(str(tmp), f"group_size:{group},zstd:3")
        for k in range(0, n, 100_000):
            for r in text_records(min(100_000, n - k), seed=k):
                w.write(r)
        w.close()
        os.replace(tmp, path)
    return str(path)


def text_shards(folder: Path, n: int = 20_000, shards: int = 20) -> list[str]:
    sub = folder / f"text-{n}-{shards}"
    sub.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    paths = []
    for k in range(shards):
        recs = (json.dumps({"id": k * n + i, "label": int(rng.integers(0, 1000)),
                            "text": "x" * 960}).encode() for i in range(n // shards))
        paths.append(str(write(sub / f"text-{k:05d}-of-{shards:05d}.array_record", recs)))
    return paths


# -- child: one run in a fresh process ---------------------------------------------------------


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_by_kind(pid: int) -> dict[str, int]:
    """`pid`'s PSS (kB) by what it maps: the arena's shared memory, the heap (brk),
    anonymous maps (Python's object arenas, big buffers, thread stacks), and files (code)."""
    out: dict[str, int] = {}
    kind = "files"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head, _, rest = line.partition(" ")
                if "-" in head and not head.endswith(":"):  # a mapping's first line
                    name = rest.split(None, 4)[4].strip() if len(rest.split(None, 4)) > 4 else ""
                    kind = ("arena" if "aioloader-arena" in name else "heap" if name == "[heap]"
                            else "anon" if not name or name.startswith("[") else "files")
                elif head == "Pss:":
                    out[kind] = out.get(kind, 0) + int(rest.split()[0])
    except OSError:
        pass
    return out


def _role(pid: int, me: int) -> str:
    if pid == me:
        return "parent"
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return "gone"
    if ppid != me:  # the forkserver's forks (their command line is the server's)
        return "workers"
    return "tracker" if "resource_tracker" in cmd else "forkserver"


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _workers(pid: int) -> list[int]:
    """`pid`'s descendants but its direct children (the forkserver, the resource tracker):
    the workers, forked by the forkserver (spawned ones would be direct children: none
    here, on Linux)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True) if c.ppid() != pid]
    except psutil.Error:
        return []


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the live processes `pids` have used so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def child_big(spec: dict[str, Any]) -> dict[str, Any]:
    import aioloader as al

    me = os.getpid()
    peak: dict[str, Any] = {"pss": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            pids = [me, *_children(me)]
            if not spec.get("breakdown"):
                peak["pss"] = max(peak["pss"], sum(_pss_kb(p) for p in pids))
                continue
            parts = {p: _pss_by_kind(p) for p in pids}
            total = sum(sum(v.values()) for v in parts.values())
            if total > peak["pss"]:  # the peak's share of each process and kind, in MB
                peak["pss"] = total
                by: dict[str, dict[str, float]] = {}
                for p, kinds in parts.items():
                    role = _role(p, me)
                    for k, kb in kinds.items():
                        row = by.setdefault(role, {})
                        row[k] = round(row.get(k, 0) + kb / 1024, 1)
                peak["by"] = by

    threading.Thread(target=sample, daemon=True).start()
    kind = spec["kind"]
    fn = {"mib": as_bytes_array, "img": as_image224, "text": decode_text}[kind]
    t0 = time.perf_counter()
    ds = al.Dataset.from_arrayrecord(spec["paths"]) \
        .shuffle(0, strategy=spec.get("shuffle", "exact")).repeat(spec["epochs"]).map(fn) \
        .batch(256)
    count, first, hwm, cpu = 0, None, 0, 0.0
    budget = {"memory_budget": spec["budget"]} if spec.get("budget") else {}
    with ds.loader(workers=spec["workers"], **budget) as it:
        for batch in it:
            if kind == "text":
                assert len(batch["id"]) == 256
            else:
                assert batch.shape[0] == 256
                int(batch[-1, -1:].sum())  # touch it
            count += 1
            if first is None:
                first = time.perf_counter()
            if count == spec["batches"]:
                # (before the loop ends: ending it closes the loader, and its workers go)
                hwm = sum(_status_kb(p, "VmHWM:") for p in [me, *_children(me)])
                cpu = _cpu_s([me, *_workers(me)])
                break
        end = time.perf_counter()
        stats = it.stats().as_dict()
    done.set()
    return {"rate": (count - 1) * 256 / (end - first), "ttfb": first - t0,
            "hwm_mb": hwm / 1024, "pss_mb": peak["pss"] / 1024,
            "cpu_us": cpu / (count * 256) * 1e6,
            "batch_mb": 0.26 if kind == "text" else 256 * fn(bytes(
                1 << 20 if kind == "mib" else int(np.prod(IMG224)))).nbytes / 1e6,
            "decoded": stats.get("cache", {}).get("decoded", 0),
            "horizons": stats.get("cache", {}).get("horizons_per_epoch", 0),
            "horizon_records": stats.get("cache", {}).get("horizon_records", 0),
            "spill_mb": stats.get("cache", {}).get("spill_bytes", 0) / 1e6,
            "spill_hits": stats.get("cache", {}).get("spill_hits", 0),
            "stats": {k: v for k, v in stats.items() if k in ("arena", "workers")},
            **({"peak_by": peak["by"]} if "by" in peak else {})}


def child_first(spec: dict[str, Any]) -> dict[str, Any]:
    t_imp = time.perf_counter()
    if spec["lib"] == "grain":
        import grain
        from absl import flags

        flags.FLAGS.mark_as_parsed()  # mp_prefetch reads absl flags

        t0 = time.perf_counter()
        ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(spec["paths"])) \
            .shuffle(seed=0).map(decode_text).batch(256)
        if spec["workers"]:
            it = iter(ds.to_iter_dataset().mp_prefetch(
                grain.MultiprocessingOptions(num_workers=spec["workers"])))
        else:
            it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=spec.get("threads", 4))))
        next(it)
        t1 = time.perf_counter()
    else:
        import aioloader as al

        t0 = time.perf_counter()
        ds = al.Dataset.from_arrayrecord(spec["paths"]).shuffle(0).map(decode_text).batch(256)
        loader = ds.loader(workers=spec["workers"])
        it = iter(loader)  # kept: dropping it would close the loader inside the timing
        next(it)
        t1 = time.perf_counter()
    # CPU of this process and every process under it (forkserver, workers), import included
    cpu = _cpu_s([os.getpid(), *_children(os.getpid())])
    return {"ttfb": t1 - t0, "import": t0 - t_imp, "total": t1 - t_imp, "cpu": cpu}


# -- driver -----------------------------------------------------------------------------------


def run_child(mode: str, spec: dict[str, Any], tree: Path, workdir: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=f"{workdir}:{tree}", GRAIN_LOG_LEVEL="error")
    env.pop("PYTHONSAFEPATH", None)
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_big", "child", mode,
                          json.dumps(spec)], cwd=workdir, env=env, capture_output=True,
                         text=True, timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"child failed ({tree}, {spec}):\n{out.stderr[-3000:]}")


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3g} [{min(xs):.3g}–{max(xs):.3g}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["big", "first", "groups", "child"])
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path, default=HERE.parent)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path("/tmp/aioloader-bench-big"))
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--kinds", default="mib,img")
    ap.add_argument("--batches", type=int, help="big: batches a run (10 mib, 32 img)")
    ap.add_argument("--breakdown", action="store_true",
                    help="big: the peak PSS by process (parent, forkserver, resource tracker, "
                         "workers) and kind (arena, heap, anon, files), from /proc/*/smaps")
    ap.add_argument("--no-grain", action="store_true", help="first: ours only")
    ap.add_argument("--records", default="50000,200000,1000000", help="groups: file sizes")
    ap.add_argument("--shuffles", default="exact,block", help="groups: shuffle strategies")
    ap.add_argument("--limit", type=int, default=0,
                    help="groups: read only the first this many positions of the epoch "
                         "(0: all but the last batch)")
    ap.add_argument("--budgets", default="0",
                    help="groups: memory_budget values in MiB (0: the default)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/aioloader-bench-big-work"),
                    help="where the benchmarks are copied for the children")
    a = ap.parse_args()
    if a.mode == "child":
        fn = child_first if a.rest[0] == "first" else child_big
        print("RESULT " + json.dumps(fn(json.loads(a.rest[1]))), flush=True)
        os._exit(0)
    workdir = a.workdir
    if (workdir / "benchmarks").exists():
        shutil.rmtree(workdir / "benchmarks")
    shutil.copytree(HERE, workdir / "benchmarks",
                    ignore=shutil.ignore_patterns("data", "__pycache__", "*.png"))
    trees = {"before": a.before.resolve(), "after": a.after.resolve()} if a.before else \
        {"after": a.after.resolve()}
    for tree in trees.values():  # as installed: this machine sets PYTHONDONTWRITEBYTECODE,
        # so each child (and its forkserver) would compile an editable tree's stale modules
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "aioloader")],
                       check=True)
    configs: list[tuple[str, dict[str, Any]]] = []
    if a.mode == "big":
        data = big_data(a.data)
        for kind in a.kinds.split(","):
            for w in map(int, a.workers.split(",")):
                batches = a.batches or (10 if kind == "mib" else 32)
                configs.append((f"{kind} w={w}", {"kind": kind, "paths": data[kind],
                                                  "workers": w, "batches": batches,
                                                  "epochs": 8, "breakdown": a.breakdown}))
    elif a.mode == "groups":
        for n in map(int, a.records.split(",")):
            path = group_file(a.data, n)
            for mib in map(int, a.budgets.split(",")):
                for shuffle in a.shuffles.split(","):
                    for w in map(int, a.workers.split(",")):
                        configs.append((f"{n} {shuffle} w={w}" + (f" {mib}MiB" if mib else ""), {
                            "kind": "text", "paths": [path], "workers": w, "shuffle": shuffle,
                            "batches": min(n, a.limit or n) // 256, "epochs": 1,
                            "breakdown": False,
                            "budget": mib << 20}))
    else:
        paths = text_shards(a.data)
        for w in map(int, a.workers.split(",")):
            configs.append((f"ours w={w}", {"lib": "aioloader", "paths": paths, "workers": w}))
            if not a.no_grain:
                configs.append((f"grain w={w}", {"lib": "grain", "paths": paths, "workers": w}))
    res: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(a.rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name, spec in configs:
            for t in order:
                if a.mode == "first" and spec["lib"] == "grain" and t != order[0]:
                    continue  # Grain does not depend on the tree: once a round
                out = run_child("first" if a.mode == "first" else "big", spec, trees[t],
                                workdir)
                res.setdefault((name, t), []).append(out)
                print(f"[{time.strftime('%H:%M:%S')}] {name} {t}: "
                      f"{ {k: v for k, v in out.items() if k != 'stats'} }",
                      file=sys.stderr, flush=True)
    for (name, t), runs in res.items():
        cols = (["ttfb", "import", "total", "cpu"] if a.mode == "first"
                else ["rate", "ttfb", "hwm_mb", "pss_mb", "cpu_us"]
                + (["decoded", "horizons", "horizon_records", "spill_mb", "spill_hits"]
                   if a.mode == "groups"
                   else []))
        print(f"| {name} | {t} | " + " | ".join(_fmt([x[c] for x in runs]) for c in cols) + " |")


if __name__ == "__main__":
    main()
