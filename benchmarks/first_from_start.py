"""First batch from the top of a script: the library's import included, as a user waits for it.

    python benchmarks/first_from_start.py [--files 10,2000] [--rounds 3] [--data-dir DIR]

`bench_files.py` starts its clock after each library's import, which leaves out Grain's
(`import grain`: over a second here) and keeps aioloader's own (its `import` loads one module;
the pipeline's names load on first use). This times what a script sees: from its first line
(`import ...`) to the first batch in hand, each run a fresh interpreter, the contenders
alternating (ABBA over rounds), after one untimed run each (bytecode, page cache). The
pipeline is bench_files': 200k text records of 1 KiB in that many files, global shuffle,
json.loads, batch 256; aioloader with `workers=2` (the worker server cold, no `warm_up()`,
no index cache), Grain with `ReadOptions(num_threads=N)` for N = 1 and 4.

Reported: seconds, median [min–max], and each contender over aioloader per round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

AIOLOADER = """
import time, sys
t0 = time.perf_counter()
import aioloader as al
from benchmarks import fns
ds = al.Dataset.from_arrayrecord(sys.argv[1]).shuffle(0).map(fns.decode_text).batch(256)
next(iter(ds.loader(workers=2)))
print("RESULT", time.perf_counter() - t0, flush=True)
import os; os._exit(0)
"""

GRAIN = """
import time, sys
t0 = time.perf_counter()
import glob
import grain
from benchmarks import fns
src = grain.sources.ArrayRecordDataSource(sorted(glob.glob(sys.argv[1])))
ds = (grain.MapDataset.source(src).shuffle(seed=0).map(fns.decode_text).batch(256)
      .to_iter_dataset(grain.ReadOptions(num_threads=int(sys.argv[2]))))
next(iter(ds))
print("RESULT", time.perf_counter() - t0, flush=True)
import os; os._exit(0)  # (Grain's prefetch threads may still be busy)
"""


def _run(code: str, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRAIN_LOG_LEVEL="error",
               AIOLOADER_INDEX_CACHE="off")
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(line.split()[1])
    raise RuntimeError(out.stderr.strip()[-600:])


def _cell(xs: list[float], f: str = ".3f") -> str:
    return f"{statistics.median(xs):{f}} [{min(xs):{f}}–{max(xs):{f}}]"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python benchmarks/first_from_start.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", default="10,2000", help="file counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data-dir", default=str(ROOT / "benchmarks" / "data"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import machine_info, sharded_dataset

    counts = [int(n) for n in args.files.split(",")]
    gen = types.SimpleNamespace(data_dir=args.data_dir)
    globs = {n: str(sharded_dataset(gen, "text", 200_000, n)[0].parent / "*.array_record")
             for n in counts}
    who = {"aioloader": (AIOLOADER,), "Grain N1": (GRAIN, "1"), "Grain N4": (GRAIN, "4")}
    res: dict[tuple[int, str], list[float]] = {}
    loads = []
    for n in counts:
        for code, *rest in who.values():
            _run(code, globs[n], *rest)  # untimed: bytecode, page cache
        for r in range(args.rounds):
            for name in (list(who) if r % 2 == 0 else list(who)[::-1]):
                code, *rest = who[name]
                res.setdefault((n, name), []).append(_run(code, globs[n], *rest))
            loads.append(os.getloadavg()[0])
    print(f"Machine: {machine_info()}; 1-min load {min(loads):.1f}–{max(loads):.1f}\n")
    print("| files | contender | from the script's first line to the first batch, s | "
          "÷ aioloader |")
    print("|---|---|---|---|")
    for n in counts:
        base = res[(n, "aioloader")]
        for name in who:
            xs = res[(n, name)]
            print(f"| {n} | {name} | {_cell(xs)} | "
                  f"{_cell([x / b for x, b in zip(xs, base)], '.2f')} |")


if __name__ == "__main__":
    main()
