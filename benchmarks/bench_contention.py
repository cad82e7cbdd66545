"""`contention`: the training loop's waiting beside a fixed CPU hog, per worker/prefetch setting.

    python -m benchmarks.bench_contention [--tree NAME=DIR ...] [--hogs 0,1,2] [--duty 1.0]
        [--settings w1,w2,auto,auto-p] [--steps 300] [--rounds 3] [--data-dir DIR]

The loop is the headline `loop` row's: text 1 KiB in 20 local shards, global shuffle,
`json.loads`, batch 256, a 10 ms step per batch (`time.sleep`: the GIL is free), and the
figure is the share of wall time spent waiting in `next()` after the first batch. The hog is
K processes started by the benchmark, each spinning at a fixed duty cycle (`--duty` of every
10 ms period busy in a pure-Python loop, the rest asleep), started before a round's hogged
runs and killed after them (each also stops once the benchmark is gone, however it ended,
and SIGTERM ends the benchmark through its cleanup); K = 0 is the same run with no hog
("quiet", which on a shared machine is only as quiet as the machine). Each run is a fresh
interpreter on one tree (`PYTHONPATH=DIR`, from a neutral copy of these benchmarks, as
`compare_trees.py` does), so two trees (before/after) are measured side by side in one
sitting: every round runs every (hog, setting, tree) once, trees alternating ABBA, settings
reversed every other round.

The table gives, per setting and tree, the median % waiting quiet and under each hog, and the
ratio hogged ÷ quiet of the same round (drift in the machine's own load cancels there), with
the settings auto ended at. `python -m benchmarks run --only contention` runs this tree alone
with K = 0 and 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BATCH = 256
SHARDS = 20
TEXT = 200_000  # records in the shards (the pipeline benchmarks' cached text set)
STEP = 0.010  # the simulated training step (bench_pipeline.STEP)
PERIOD = 0.010  # the hog's duty-cycle period
RUN_TIMEOUT = 300.0
#: name -> the loader's settings (`benchmarks.contenders` spec keys)
SETTINGS: dict[str, dict[str, Any]] = {
    "w1": {"workers": 1},
    "w2": {"workers": 2},
    "w1-p": {"workers": 1, "prefetch": "auto"},
    "w2-p": {"workers": 2, "prefetch": "auto"},
    "auto": {"workers": "auto"},
    "auto-p": {"workers": "auto", "prefetch": "auto"},
}
HOG = """
import os, sys, time
duty, period = float(sys.argv[1]), float(sys.argv[2])
busy = duty * period
parent = os.getppid()
while os.getppid() == parent:  # the benchmark gone (even by SIGKILL): stop
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
    if duty < 1.0:
        time.sleep(period - busy)
"""


@contextlib.contextmanager
def hog(k: int, duty: float) -> Iterator[list[int]]:
    """`k` processes spinning at `duty` of every `PERIOD`, killed on exit; their pids. While
    they run (in the main thread), SIGTERM raises SystemExit so that they are killed too."""
    procs: list[subprocess.Popen[bytes]] = []
    previous = _exit_on_sigterm()
    try:
        for _ in range(k):
            procs.append(subprocess.Popen([sys.executable, "-c", HOG, str(duty), str(PERIOD)]))
        time.sleep(0.3 if k else 0.0)  # spinning before the run starts
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm() -> Any:
    """Make SIGTERM raise SystemExit (the `finally` blocks run); the handler it replaced, or
    None where it cannot (not the main thread)."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, stop)


def pressure() -> float | None:
    """The CPU pressure now (Linux PSI `some avg10`, %), None where the kernel has none."""
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def workdir_copy(workdir: Path) -> Path:
    """These benchmarks copied under `workdir`, so `python -m` there imports no aioloader from
    the current directory: each run's comes from its tree's PYTHONPATH."""
    target = workdir / "benchmarks"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(HERE, target, ignore=shutil.ignore_patterns("data", "__pycache__", "*.png"))
    return workdir


def run_one(tree: Path, workdir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """One loop in a fresh interpreter on `tree`; its result (or {"error": why})."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONSAFEPATH", None)
    try:
        out = subprocess.run([sys.executable, "-m", "benchmarks.contenders", json.dumps(spec)],
                             capture_output=True, env=env, cwd=workdir, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {RUN_TIMEOUT:.0f} s"}
    lines = [ln for ln in out.stdout.decode(errors="replace").splitlines()
             if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        tail = out.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return {"error": f"exit {out.returncode}: {' | '.join(tail)[-300:]}"}
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def waiting(x: dict[str, Any]) -> float:
    """% of wall time waiting for data after the first batch (the headline `loop` figure)."""
    return 100 * (x["wait"] - x["first_wait"]) / max(x["wall"] - x["ttfb"], 1e-9)


def measure(trees: dict[str, Path], hogs: list[int], settings: list[str], steps: int,
            rounds: int, duty: float, data: Any) -> dict[tuple[str, str, int], list[dict]]:
    """Every (tree, setting, hog) `rounds` times; results keyed so."""
    from .common import log, sharded_dataset

    paths = sharded_dataset(data, "text", TEXT, SHARDS)
    base = {"lib": "aioloader", "paths": [str(p) for p in paths], "decode": "decode_text",
            "batch": BATCH, "seed": 0, "limit": steps * BATCH, "step": STEP}
    out: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="aioloader-contention-") as tmp:
        work = workdir_copy(Path(tmp))
        for name, tree in trees.items():  # warm-up: imports compiled, page cache
            run_one(tree, work, {**base, "limit": 4 * BATCH, "step": 0.0})
            log(f"contention: tree {name} = {tree}")
        for r in range(rounds):
            names = settings if r % 2 == 0 else settings[::-1]
            for k in hogs:
                with hog(k, duty):
                    for s in names:
                        order = list(trees) if (r + hogs.index(k)) % 2 == 0 \
                            else list(trees)[::-1]
                        for t in order:
                            load, psi = os.getloadavg()[0], pressure()
                            res = run_one(trees[t], work, {**base, **SETTINGS[s]})
                            res.update(load=load, psi=psi)
                            out.setdefault((t, s, k), []).append(res)
                            log(f"contention: round {r + 1}/{rounds}, hog {k}, {s}, {t}: "
                                + (res["error"] if "error" in res else
                                   f"{waiting(res):.1f}% waiting, load {load:.1f}"
                                   + _ended(res)))
    return out


def _ended(res: dict[str, Any]) -> str:
    a = res.get("autotune")
    return f", ended w{a.get('workers')} p{a.get('prefetch')}" if a else ""


def _med(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}–{max(xs):.1f}]"


def table(results: dict[tuple[str, str, int], list[dict]], trees: list[str], hogs: list[int],
          settings: list[str]) -> str:
    """Markdown: per setting and tree, % waiting per hog and hogged ÷ quiet per round."""
    hogged = [k for k in hogs if k]
    head = (["setting", "tree"] + [f"% waiting, hog {k}" if k else "% waiting, quiet"
                                   for k in hogs]
            + ([f"hog {k} ÷ quiet" for k in hogged] if 0 in hogs else []) + ["auto ended at"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 3)
             + "---|"]
    for s in settings:
        for t in trees:
            runs = {k: results.get((t, s, k), []) for k in hogs}
            cells = [_med([waiting(x) for x in runs[k] if "error" not in x]) for k in hogs]
            if 0 in hogs:
                for k in hogged:
                    ratios = [waiting(h) / max(waiting(q), 0.05)
                              for q, h in zip(runs[0], runs[k])
                              if "error" not in q and "error" not in h]
                    cells.append("—" if not ratios else
                                 f"**{statistics.median(ratios):.1f}×** "
                                 f"[{min(ratios):.1f}–{max(ratios):.1f}]")
            ends = sorted({_ended(x)[8:] for k in hogs for x in runs[k] if x.get("autotune")})
            failed = sum("error" in x for k in hogs for x in runs[k])
            cells.append((", ".join(ends) or "—") + (f" ({failed} failed)" if failed else ""))
            lines.append(f"| {s} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def loads(results: dict[tuple[str, str, int], list[dict]], hogs: list[int]) -> str:
    """The machine's 1-minute load (and CPU pressure) at the runs' starts, per hog."""
    parts = []
    for k in hogs:
        xs = [x for (_, _, h), v in results.items() if h == k for x in v]
        load = [x["load"] for x in xs]
        psi = [x["psi"] for x in xs if x.get("psi") is not None]
        parts.append(f"hog {k}: load {_med(load)}"
                     + (f", CPU pressure (PSI some avg10) {_med(psi)}%" if psi else ""))
    return "; ".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_contention",
        description="The training loop (10 ms step, text 1 KiB, 20 shards, json.loads, batch "
                    "256) beside a fixed CPU hog: % of wall time waiting for data, per "
                    "worker/prefetch setting, quiet and hogged, for one or more aioloader "
                    "trees side by side.",
        epilog="settings: " + ", ".join(f"{n} = {v}" for n, v in SETTINGS.items())
               + "\n\nexample (before/after, one sitting):\n"
                 "  python -m benchmarks.bench_contention --tree before=/tmp/base "
                 "--tree after=. --hogs 0,1,2 --rounds 3",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", default=None, metavar="NAME=DIR",
                   help="an aioloader checkout to measure (repeatable; default: this one)")
    p.add_argument("--hogs", default="0,1,2", metavar="K,K,...",
                   help="hog process counts to run beside the loop (0: none; default 0,1,2)")
    p.add_argument("--duty", type=float, default=1.0, metavar="D",
                   help="share of every 10 ms each hog process spins (0 < D <= 1; default 1)")
    p.add_argument("--settings", default=",".join(SETTINGS), metavar="S,S,...",
                   help=f"settings to run (default all: {', '.join(SETTINGS)})")
    p.add_argument("--steps", type=int, default=300, metavar="N",
                   help="training steps (batches) per run (default 300: 3 s of steps)")
    p.add_argument("--rounds", type=int, default=3, metavar="N",
                   help="rounds; each runs every (hog, setting, tree) once (default 3)")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="where the generated shards are cached (default benchmarks/data)")
    args = p.parse_args(argv)
    args.hogs = [int(k) for k in args.hogs.split(",")]
    args.settings = args.settings.split(",")
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown or not 0 < args.duty <= 1 or min(args.hogs) < 0:
        p.error(f"unknown settings {unknown}" if unknown else "need 0 < --duty <= 1, K >= 0")
    trees = args.tree or [f"this={HERE.parent}"]
    args.trees = {t.partition("=")[0]: Path(t.partition("=")[2]).resolve() for t in trees}
    return args


def main(argv: list[str] | None = None) -> int:
    from .common import machine_info

    args = parse_args(argv)
    command = "python -m benchmarks.bench_contention " + " ".join(
        sys.argv[1:] if argv is None else argv)
    results = measure(args.trees, args.hogs, args.settings, args.steps, args.rounds,
                      args.duty, args)
    print(f"Machine: {machine_info()}\n\nCommand: `{command}`\n\n"
          f"Trees: {', '.join(f'{n} = {p}' for n, p in args.trees.items())}\n\n"
          f"Load: {loads(results, args.hogs)}\n\n"
          + table(results, list(args.trees), args.hogs, args.settings))
    return 0


def _register() -> None:
    from .common import Row, Stats, register

    @register("contention", "the training loop's % waiting beside a CPU hog (hogged ÷ quiet)",
              "quiet")
    def run_contention(args: Any) -> list[Row]:
        steps, rounds = (150, 2) if args.quick else (300, args.repeats or 3)
        settings = ["w1", "w2", "auto-p"] if args.quick else list(SETTINGS)
        res = measure({"this": HERE.parent}, [0, 1], settings, steps, rounds, 1.0, args)
        rows = []
        for s in settings:
            quiet = [waiting(x) for x in res[("this", s, 0)] if "error" not in x]
            hogged = [waiting(x) for x in res[("this", s, 1)] if "error" not in x]
            if quiet and hogged:
                rows.append(Row(f"training loop, {STEP * 1e3:.0f} ms step, {steps} steps, "
                                f"one CPU hog: % waiting, {SETTINGS[s]}", "%",
                                Stats.of(hogged), Stats.of(quiet),
                                Stats.of(max(q, 0.05) / max(h, 0.05)
                                         for q, h in zip(quiet, hogged)),
                                note=loads(res, [0, 1])))
        return rows


_register()

if __name__ == "__main__":
    sys.exit(main())
