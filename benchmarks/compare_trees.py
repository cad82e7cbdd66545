"""Before/after: run benchmarks against two aioloader trees side by side, in one sitting.

    python benchmarks/compare_trees.py --before /work/wt-base --after /work/main \\
        --only pipeline --only loop --rounds 2 -- --data-dir /tmp/benchdata

Everything after `--` goes to `python -m benchmarks run` unchanged (`--quick`, `--repeats N`,
`--data-dir DIR`...). One copy of these benchmarks measures both trees: it is copied to a
neutral directory (`--workdir`), because `python -m` puts the current directory ahead of
PYTHONPATH, and each run gets `PYTHONPATH=<tree>`, so `import aioloader` finds that tree (checked
before anything is timed). Runs alternate in ABBA order (before, after; after, before; ...), so
drift and warm-up hit both trees alike. Every round gives each row an after ÷ before ratio of
the medians, turned into "× better" (higher is better for rates, lower for seconds, bytes and CPU;
shares in % are compared as after − before, in points); the table gives its median [min–max]
over rounds. Where a row has a peer, the peer's own after ÷ before is shown too: when the peer
is Grain the same code ran both times, so it says how much the machine drifted (for `stream`
the peer is aioloader's own batch-mode control); and the run's own aioloader ÷ peer ratio,
paired per repeat, is compared as well, since it cancels drift within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import fmt  # (run as a script: benchmarks/ is on sys.path)

HERE = Path(__file__).resolve().parent
#: Units where a larger figure is better; every other unit is a cost.
RATE_UNITS = ("rec/s", "MB/s", "GB/s", "×", "batches/s")
#: A configuration named in a row's note.
CONFIG = re.compile(r"(?:workers|threads)=\d+")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare(workdir: Path) -> Path:
    """A fresh copy of this benchmarks package under `workdir` (no cached data, no bytecode)."""
    target = workdir / "benchmarks"
    if target.exists():
        shutil.rmtree(target)
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(HERE, target, ignore=shutil.ignore_patterns("data", "__pycache__", "*.png"))
    return target


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.pop("PYTHONSAFEPATH", None)
    return env


def check_tree(python: str, tree: Path, workdir: Path) -> str:
    """Where `import aioloader` resolves from `workdir` with this tree; refuse a mix-up."""
    out = subprocess.run([python, "-c", "import aioloader; print(aioloader.__file__)"],
                         cwd=workdir, env=env_for(tree), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: import aioloader failed: {out.stderr.strip()[-500:]}")
    path = Path(out.stdout.strip()).resolve()
    if tree.resolve() not in path.parents:
        raise SystemExit(f"{tree}: aioloader was imported from {path}, not from the tree")
    return str(path.parent)


def run_once(python: str, tree: Path, workdir: Path, bench_args: list[str], tag: str,
             results: Path) -> dict[str, Any]:
    """One `python -m benchmarks run ...` against `tree`; its JSON results."""
    out = results / f"{tag}.json"
    logfile = results / f"{tag}.log"
    cmd = [python, "-m", "benchmarks", "run", *bench_args, "--json", str(out)]
    log(f"{tag}: {' '.join(cmd[1:])}  (PYTHONPATH={tree})")
    t0 = time.perf_counter()
    with open(logfile, "w") as f:
        proc = subprocess.run(cmd, cwd=workdir, env=env_for(tree), stdout=f,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not out.exists():
        tail = logfile.read_text().splitlines()[-15:]
        raise SystemExit(f"{tag} failed (exit {proc.returncode}); log {logfile}:\n"
                         + "\n".join(tail))
    log(f"{tag}: done in {time.perf_counter() - t0:.0f} s")
    return json.loads(out.read_text())


def _rows(result: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Rows by (benchmark, workload, k): the k-th row of that name (some tables repeat a
    workload for another configuration, told apart in the note)."""
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for b in result["benchmarks"]:
        for r in b["rows"]:
            k = sum(1 for key in out if key[:2] == (b["bench"], r["workload"]))
            out[(b["bench"], r["workload"], k)] = r
    return out


def _med(stats: dict[str, float] | None) -> float | None:
    return None if stats is None else stats["median"]


def _better(unit: str, before: float | None, after: float | None) -> float | None:
    """after vs before as "× better": > 1 means the after tree is better."""
    if before is None or after is None or before <= 0 or after <= 0:
        return None
    return after / before if unit in RATE_UNITS else before / after


def _summary(values: list[float | None], points: bool = False) -> str:
    v = sorted(x for x in values if x is not None)
    if not v:
        return "—"
    if points:
        return f"**{statistics.median(v):+.1f} pts** [{v[0]:+.1f} – {v[-1]:+.1f}]"
    return f"**{statistics.median(v):.2f}×** [{v[0]:.2f}–{v[-1]:.2f}]"


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: one per benchmark row, ratios paired per round."""
    lines = ["| benchmark | workload | unit | before | after | after vs before (× better; "
             "%: after − before) | peer: after vs before | vs peer: after vs before |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    rounds = list(zip(before, after, strict=True))
    peers = {b["bench"]: b["peer"] for b in before[0]["benchmarks"]}
    for key, row in _rows(before[0]).items():
        unit = row["unit"]
        pairs = [(_rows(b).get(key), _rows(a).get(key)) for b, a in rounds]
        pairs = [(b, a) for b, a in pairs if b is not None and a is not None]
        if not pairs:
            continue
        if unit == "%":  # shares near 0 make ratios meaningless: after − before, points
            ours = [_med(a["ours"]) - _med(b["ours"]) for b, a in pairs
                    if b["ours"] is not None and a["ours"] is not None]
        else:
            ours = [_better(unit, _med(b["ours"]), _med(a["ours"])) for b, a in pairs]
        peer = [_better(unit, _med(b["peer"]), _med(a["peer"])) for b, a in pairs]
        # The run's own ratio is already "× better than the peer": higher is better.
        vs = [_better("×", _med(b["ratio"]), _med(a["ratio"])) for b, a in pairs]
        b_med = [_med(b["ours"]) for b, _ in pairs]
        a_med = [_med(a["ours"]) for _, a in pairs]
        b_val = statistics.median(x for x in b_med if x is not None) if any(
            x is not None for x in b_med) else None
        a_val = statistics.median(x for x in a_med if x is not None) if any(
            x is not None for x in a_med) else None
        # Notes name the configuration a run chose ("workers=2", "threads=4"): flag rows
        # where it differs between runs, as their ratios compare unlike with unlike.
        configs = {tuple(CONFIG.findall(r["note"])) for pair in pairs for r in pair}
        flag = " ⚠ configuration differs between runs" if len(configs) > 1 else ""
        nth = f" (#{key[2] + 1})" if key[2] else ""
        lines.append(f"| {key[0]} (peer: {peers[key[0]]}) | {key[1]}{nth}{flag} | {unit} "
                     f"| {fmt(b_val)} "
                     f"| {fmt(a_val)} | {_summary(ours, unit == '%')} | {_summary(peer)} "
                     f"| {_summary(vs)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1:]
    p = argparse.ArgumentParser(prog="benchmarks/compare_trees.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="the tree before the change")
    p.add_argument("--after", type=Path, help="the tree after the change")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="benchmark to run (repeatable), as for `python -m benchmarks run`")
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="run nothing: tabulate the results kept in DIR by an earlier call")
    p.add_argument("--rounds", type=int, default=2,
                   help="ABBA rounds: each tree runs this many times (default 2)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/benchrun"),
                   help="where the benchmarks are copied and results kept (/tmp/benchrun)")
    p.add_argument("--python", default=sys.executable, help="the interpreter (this one)")
    p.add_argument("--output", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    if args.from_dir is not None:
        runs = {tag: [json.loads(f.read_text()) for f in sorted(args.from_dir.glob(
            f"{tag}-*.json"), key=lambda f: int(f.stem.split("-")[1]))]
            for tag in ("before", "after")}
        n = min(len(runs["before"]), len(runs["after"]))
        print("\n".join(compare(runs["before"][:n], runs["after"][:n])))
        return 0
    if not (args.before and args.after and args.only):
        p.error("--before, --after and --only are required (unless --from)")
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if "--data-dir" not in extra:  # the copy has no data: use this package's cache
        extra += ["--data-dir", str(HERE / "data")]
    bench_args = [x for name in args.only for x in ("--only", name)] + extra

    workdir = args.workdir.resolve()
    prepare(workdir)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    where = {tag: check_tree(args.python, tree, workdir) for tag, tree in trees.items()}
    results = workdir / "results" / time.strftime("%Y%m%d-%H%M%S")
    results.mkdir(parents=True)
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for tag in order:
            runs[tag].append(run_once(args.python, trees[tag], workdir, bench_args,
                                      f"{tag}-{r + 1}", results))

    head = [
        f"Machine: {runs['before'][0]['machine']}", "",
        f"Command: `python benchmarks/compare_trees.py {' '.join(sys.argv[1:])}` "
        f"({args.rounds} round(s), ABBA order; each run: `python -m benchmarks run "
        f"{' '.join(bench_args)}`)", "",
        f"before: {runs['before'][0]['aioloader']} ({where['before']})", "",
        f"after: {runs['after'][0]['aioloader']} ({where['after']})", "",
    ]
    text = "\n".join(head + compare(runs["before"], runs["after"]))
    print(text, flush=True)
    (results / "compare.md").write_text(text + "\n")
    if args.output:
        args.output.write_text(text + "\n")
    log(f"results and logs in {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
