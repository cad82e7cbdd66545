"""What `import aioloader` costs, and the first batch with workers with and without
`aioloader.warm_up()`, each in fresh processes, trees interleaved.

    python benchmarks/bench_import.py import --before /work/wt-base --after . --rounds 7
    python benchmarks/bench_import.py first --before /work/wt-base --after . --rounds 5

`import`: in a fresh interpreter each, interleaved: `import numpy`, `import aioloader`, and
`import aioloader; aioloader.Dataset` (what describing a pipeline loads): wall and CPU seconds
of the import alone (the interpreter's own start excluded), aioloader's modules loaded, child
processes started; then `python -X importtime -c "import aioloader"`: the `aioloader` line's
cumulative time and the sum over all top-level lines (site included). The aim: `import
aioloader` ≤ `import numpy` + 0.35 s (`ok` column).

`first`: 20 shards of 1 KiB JSON, shuffle, json.loads, batch 256, workers=2 (`--workers`):
the child imports aioloader, calls `warm_up()` or not, sleeps `--gap` s (the user's own
set-up: building a model), then times building the pipeline to the first batch in hand.
`total` is import + gap + first batch; `cpu` the CPU of the process and all under it. A
`before` tree (the worker server started at import) runs without warm_up.

Every run is `PYTHONPATH=<copy of these benchmarks>:<tree>` from a neutral directory; the
trees are byte-compiled first (this machine sets PYTHONDONTWRITEBYTECODE).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKDIR = Path("/tmp/aioloader-bench-import-work")
LIMIT = 0.35  # s over `import numpy`

IMPORTS = {"numpy": "import numpy", "aioloader": "import aioloader",
           "describe": "import aioloader; aioloader.Dataset"}
_TIMED = """
import json, sys, time
t, c = time.perf_counter(), time.process_time()
{code}
wall, cpu = time.perf_counter() - t, time.process_time() - c
import psutil
print("RESULT " + json.dumps({{"wall": wall, "cpu": cpu,
    "modules": sum(m.split(".")[0] == "aioloader" for m in sys.modules),
    "children": len(psutil.Process().children(recursive=True))}}))
"""


def decode_text(record: bytes) -> dict:
    return json.loads(record)


def child_first(spec: dict[str, Any]) -> dict[str, Any]:
    t_imp = time.perf_counter()
    import aioloader as al

    if spec["warm_up"]:
        al.warm_up()
    time.sleep(spec["gap"])
    t0 = time.perf_counter()
    ds = al.Dataset.from_arrayrecord(spec["paths"]).shuffle(0).map(decode_text).batch(256)
    loader = ds.loader(workers=spec["workers"])
    it = iter(loader)  # kept: dropping it would close the loader inside the timing
    next(it)
    t1 = time.perf_counter()
    import psutil

    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    cpu = sum(sum(p.cpu_times()[:2]) for p in procs)
    return {"ttfb": t1 - t0, "total": t1 - t_imp, "cpu": cpu}


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{WORKDIR}:{tree}")
    env.pop("PYTHONSAFEPATH", None)
    return env


def _result(args: list[str], tree: Path) -> dict[str, Any]:
    out = subprocess.run(args, cwd=WORKDIR, env=_env(tree), capture_output=True, text=True,
                         timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"child failed ({tree}, {args[1:3]}):\n{out.stderr[-3000:]}")


def importtime(tree: Path) -> dict[str, float]:
    """`-X importtime`: the `aioloader` line's cumulative µs and all top-level lines' sum."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import aioloader"],
                         cwd=WORKDIR, env=_env(tree), capture_output=True, text=True,
                         check=True)
    top = [line.split("|") for line in out.stderr.splitlines()
           if line.startswith("import time:") and "|" in line
           and not line.split("|")[2].startswith("  ") and "cumulative" not in line]
    return {"aioloader_s": sum(int(c) for _, c, n in top if n.strip() == "aioloader") / 1e6,
            "total_s": sum(int(c) for _, c, _n in top) / 1e6}


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}]"


def run_import(trees: dict[str, Path], rounds: int) -> None:
    res: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for t in order:
            for name, code in IMPORTS.items():
                if name == "numpy" and t != order[0]:
                    continue  # numpy does not depend on the tree: once a round
                out = _result([sys.executable, "-c", _TIMED.format(code=code)], trees[t])
                out.update(importtime(trees[t]) if name == "aioloader" else {})
                res.setdefault(("—" if name == "numpy" else t, name), []).append(out)
        print(f"[{time.strftime('%H:%M:%S')}] round {r + 1}/{rounds}", file=sys.stderr)
    numpy = statistics.median(x["wall"] for x in res[("—", "numpy")])
    print("| tree | import | wall (s) | CPU (s) | − numpy wall | ok (≤ numpy + 0.35 s) "
          "| modules | children | -X importtime: aioloader / all (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (t, name), runs in sorted(res.items(), key=lambda kv: (kv[0][1] != "numpy", kv[0])):
        wall = statistics.median(x["wall"] for x in runs)
        it = (f"{_fmt([x['aioloader_s'] for x in runs])} / {_fmt([x['total_s'] for x in runs])}"
              if "total_s" in runs[0] else "—")
        print(f"| {t} | {IMPORTS[name]} "
              f"| {_fmt([x['wall'] for x in runs])} | {_fmt([x['cpu'] for x in runs])} "
              f"| {wall - numpy:+.3f} | {'yes' if wall <= numpy + LIMIT else 'NO'} "
              f"| {runs[0]['modules']} | {max(x['children'] for x in runs)} | {it} |")


def run_first(trees: dict[str, Path], rounds: int, a: argparse.Namespace) -> None:
    sys.path.insert(0, str(WORKDIR))
    from benchmarks.bench_big import text_shards

    paths = text_shards(a.data)
    configs = [(t, w) for t in trees
               for w in ((False, True) if t == "after" or a.warm_before else (False,))]
    res: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for r in range(rounds):
        for t, warm in (configs if r % 2 == 0 else configs[::-1]):
            spec = {"paths": paths, "workers": a.workers, "warm_up": warm, "gap": a.gap}
            out = _result([sys.executable, "-m", "benchmarks.bench_import", "child",
                           json.dumps(spec)], trees[t])
            res.setdefault((t, warm), []).append(out)
            print(f"[{time.strftime('%H:%M:%S')}] {t} warm_up={warm}: {out}", file=sys.stderr)
    print(f"| tree | warm_up() | first batch (s) | import + {a.gap:g} s + first batch (s) "
          "| CPU, process tree (s) |")
    print("|---|---|---|---|---|")
    for (t, warm), runs in res.items():
        print(f"| {t} | {'yes' if warm else 'no'} | {_fmt([x['ttfb'] for x in runs])} "
              f"| {_fmt([x['total'] for x in runs])} | {_fmt([x['cpu'] for x in runs])} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["import", "first", "child"])
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path, default=HERE.parent)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", type=Path, default=Path("/tmp/aioloader-bench-big"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gap", type=float, default=0.5,
                    help="first: seconds between import (and warm_up) and the pipeline")
    ap.add_argument("--warm-before", action="store_true",
                    help="first: the before tree has warm_up() too (runs with and without)")
    a = ap.parse_args()
    if a.mode == "child":
        print("RESULT " + json.dumps(child_first(json.loads(a.rest[0]))), flush=True)
        os._exit(0)
    if (WORKDIR / "benchmarks").exists():
        shutil.rmtree(WORKDIR / "benchmarks")
    shutil.copytree(HERE, WORKDIR / "benchmarks",
                    ignore=shutil.ignore_patterns("data", "__pycache__", "*.png"))
    trees = {"before": a.before.resolve(), "after": a.after.resolve()} if a.before else \
        {"after": a.after.resolve()}
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "aioloader")],
                       check=True)
    if a.mode == "import":
        run_import(trees, a.rounds)
    else:
        run_first(trees, a.rounds, a)


if __name__ == "__main__":
    main()
