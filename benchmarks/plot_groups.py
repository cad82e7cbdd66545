"""The picture of an exact shuffle's cost over large groups in docs/performance.md, drawn
from `bench_big groups` runs (its stderr: one line a run), and the table behind it.

    python -m benchmarks.plot_groups --curve curve.err [curve5m.err ...] \\
        --sweep sweep.err -o docs/images/exact-shuffle-cpu.png

Left: CPU µs a record (parent and workers, medians) against the records in the file, one
line per shuffle × workers. Right: one file at several `memory_budget`s, CPU µs a record
against the horizons an epoch needs (records ÷ half the budget), workers=0.
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
from pathlib import Path

RUN = re.compile(r"^\[[\d:]+\] (\d+) (exact|block) w=(\d+)(?: (\d+)MiB)? (\w+): (\{.*\})$")


def rows(paths: list[Path]) -> list[dict]:
    """The runs in `paths` (`bench_big groups`' stderr: one `[time] name tree: {...}` line
    a run; several files and rounds pooled), one row per records × shuffle × workers ×
    budget: its figures' medians and how many runs."""
    runs: dict[tuple, list[dict]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            m = RUN.match(line.strip())
            if m:
                key = (int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4) or 512))
                runs.setdefault(key, []).append(ast.literal_eval(m.group(6)))
    out = []
    for (n, shuffle, w, mib), got in sorted(runs.items()):
        row: dict = {"records": n, "shuffle": shuffle, "workers": w, "budget_mib": mib,
                     "runs": len(got)}
        for k in got[0]:
            if isinstance(got[0][k], int | float):
                row[k] = statistics.median(g[k] for g in got)
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plot_groups")
    p.add_argument("--curve", type=Path, nargs="+", required=True)
    p.add_argument("--sweep", type=Path, nargs="*", default=[])
    p.add_argument("-o", "--out", type=Path, required=True)
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = [r for r in rows(a.curve) if r["budget_mib"] == 512]
    sweep = rows(a.sweep)
    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(10 if sweep else 6, 3.6),
                             squeeze=False)
    ax = axes[0][0]
    for shuffle, style in (("exact", "-"), ("block", "--")):
        for w, colour in ((0, "tab:blue"), (1, "tab:orange"), (2, "tab:green")):
            pts = sorted((r["records"], r["cpu_us"]) for r in curve
                         if r["shuffle"] == shuffle and r["workers"] == w)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o",
                        color=colour, label=f"{shuffle}, workers={w}")
    ax.set_xscale("log")
    ax.set_xlabel("records in the file (1 KiB JSON, group_size 65536)")
    ax.set_ylabel("CPU µs per record")
    ax.set_ylim(bottom=0)
    ax.set_title("memory_budget 512 MiB (default)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if sweep:
        ax = axes[0][1]
        pts = sorted((r["horizons"] or 1, r["cpu_us"],
                      f"{r['budget_mib']} MiB" + ("" if r["horizons"] else " (cache)"))
                     for r in sweep)
        ax.plot([h for h, _, _ in pts], [c for _, c, _ in pts], "-", marker="o",
                color="tab:blue")
        for h, c, mib in pts:
            ax.annotate(mib, (h, c), textcoords="offset points", xytext=(4, -12),
                        fontsize=8)
        n = sweep[0]["records"]
        ax.set_xlabel("horizons an epoch (records ÷ half of memory_budget)")
        ax.set_ylabel("CPU µs per record")
        ax.set_ylim(bottom=0)
        ax.set_title(f"exact shuffle, {n:,} records, workers=0", fontsize=10)
        ax.grid(alpha=0.3)
    for r in curve + sweep:  # the table (medians), as RESULTS.md has it
        print(f"| {r['records']:,} | {r['shuffle']} | {r['workers']} | {r['budget_mib']} | "
              f"{r['cpu_us']:.1f} | {r['rate'] / 1e3:.1f}k | {r['decoded']:.0f} | "
              f"{r.get('horizons', 0):.0f} | {r['pss_mb']:.0f} | {r['runs']} |")
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=80)


if __name__ == "__main__":
    main()
