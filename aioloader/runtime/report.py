"""The run report (`it.stats().report(path)`, `aioloader bench --report`): one HTML page that
needs no network to view, with plots over time and the stats table with its legend.

Figures come from `stats` (the summary, the table) and `timeline` (the snapshots and the
per-interval rates); this module only lays them out. The run's data is embedded once, as a
JSON block (`<script type="application/json" id="aioloader-report-data">`): the page's
script (`runtime.reportpage`) draws the plots from it, and tests read it back. Every string
that goes in passes `redact` (URLs lose their userinfo and query values): the page holds no
credential even where a name of the pipeline quoted one.

Writing never touches a file but the one named: the page goes to a fresh temporary file
beside it, which then replaces `path`; a folder is refused.
"""

from __future__ import annotations

import html
import json
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ..urls import redact
from .reportpage import SCRIPT, STYLE
from .table import LEGEND
from .timeline import rates

__all__ = ["DATA_ID", "check_path", "page_data", "render_page", "write_page"]

DATA_ID = "aioloader-report-data"  # the id of the page's JSON block
VERSION = 1  # of the JSON block's layout


def _clean(value: Any) -> Any:
    """`value` with every string redacted and every non-finite number as None (JSON has
    no NaN), in copies."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {redact(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _plot(pid: str, title: str, unit: str, note: str, t: list[float],
          series: Sequence[tuple[str, list[float]]], top: float | None = None
          ) -> dict[str, Any]:
    return {"id": pid, "title": title, "unit": unit, "note": note, "max": top, "t": t,
            "series": [{"name": name, "values": values} for name, values in series]}


def _plots(summary: Mapping[str, Any], samples: Sequence[Mapping[str, float]],
           stages: Sequence[str]) -> list[dict[str, Any]]:
    r = rates(samples, stages)
    t = r["t"]
    ran = [name for name in stages
           if summary.get("stages", {}).get(name, {}).get("items")
           or any(r["busy_pct"][name])]
    return [
        _plot("batches", "Batches per second", "batches/s",
              "batches your loop got in each interval", t,
              [("batches/s", r["batches_per_s"])]),
        _plot("wait", "Time the consumer waited", "%",
              "share of each interval your loop spent waiting for the next batch (over 1%: "
              "loading holds training back)", t, [("waited", r["wait_pct"])], 100.0),
        _plot("busy", "Busy, per stage", "%",
              "share of each interval a stage kept its cores busy (a stage of N workers: "
              "shared over N)", t, [(name, r["busy_pct"][name]) for name in ran], 100.0),
        _plot("reads", "Reads in flight", "reads",
              "reads of the dataset's bytes in flight in this process, on average over each "
              "interval (the workers' own reads of local files are not measured)", t,
              [("reads in flight", r["reads_in_flight"])]),
        _plot("cache", "Chunk cache", "/s",
              "chunks of a remote dataset found already read (hits) or read (misses), per "
              "second", t, [("hits/s", r["cache_hits_per_s"]),
                            ("misses/s", r["cache_misses_per_s"])]),
        _plot("retries", "Retries", "retries",
              "retries of failed reads so far (transient errors: 408, 429, 5xx, resets)", t,
              [("retries", r["retries"])]),
    ]


def page_data(summary: Mapping[str, Any], samples: Sequence[Mapping[str, float]], table: str,
              stages: Sequence[str]) -> dict[str, Any]:
    """What the page shows, as the JSON block holds it: `summary` (`stats.as_dict()`), the
    snapshots, the plots (`timeline.rates` of them), the table (`str(stats)`) and its legend;
    every string redacted."""
    return _clean({
        "version": VERSION,
        "summary": summary,
        "samples": [dict(s) for s in samples],
        "plots": _plots(summary, samples, stages),
        "table": table,
        "legend": [list(entry) for entry in LEGEND],
    })


def _json_block(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, separators=(",", ":"), allow_nan=False,
                      default=lambda o: redact(str(o)))
    # inside <script>: no "</script>" nor "<!--" can end or bend the block
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _figure(plot: Mapping[str, Any]) -> str:
    e = html.escape
    return (f'<figure class="plot" data-plot="{e(plot["id"])}">'
            f'<figcaption>{e(plot["title"])} <small>{e(plot["note"])}</small></figcaption>'
            '<div class="canvas"></div></figure>')


def render_page(summary: Mapping[str, Any], samples: Sequence[Mapping[str, float]],
                table: str, stages: Sequence[str]) -> str:
    """The page, as text (see `page_data` for the arguments)."""
    data = page_data(summary, samples, table, stages)
    s, e = data["summary"], html.escape
    ttfb = s.get("time_to_first_batch_s")
    meta = (f'{s.get("batches", 0):,} batches, {s.get("records", 0):,} records in '
            f'{s.get("elapsed_s") or 0:.2f} s; first batch after '
            + (f"{ttfb:.3f} s" if ttfb is not None else "-")
            + f'; the consumer waited {100 * (s.get("wait_fraction") or 0):.1f}% of the time.')
    legend = "".join(f"<dt>{e(label)}</dt><dd>{e(text)}</dd>" for label, text in data["legend"])
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>aioloader run report</title>",
        f"<style>{STYLE}</style></head>",
        "<body>",
        '<header><h1>aioloader run report</h1>',
        f'<p class="meta">{e(meta)}</p></header>',
        '<section id="plots"><h2>Over time</h2>',
        '<p class="note">Each point is one interval (the figures between two snapshots, taken '
        "as batches were handed out); a long run keeps its whole length at a coarser step.</p>",
        '<noscript><p>The plots are drawn by the page\'s script; the figures are in its JSON '
        "block.</p></noscript>",
        '<div class="plots">' + "".join(_figure(p) for p in data["plots"]) + "</div></section>",
        '<section id="table"><h2>The stats table</h2>',
        f'<pre class="stats-table">{e(data["table"])}</pre></section>',
        '<section id="legend"><h2>What the table\'s columns and lines mean</h2>',
        f'<dl class="legend">{legend}</dl></section>',
        f'<script type="application/json" id="{DATA_ID}">{_json_block(data)}</script>',
        f"<script>{SCRIPT}</script>",
        "</body></html>",
        "",
    ])


def check_path(path: str | os.PathLike[str]) -> str:
    """`path` as a string if a report can be written there (before a run, to refuse early):
    not a folder, in a folder that exists."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a folder; the report is one HTML file: name it "
                                f"(e.g. {os.path.join(path, 'report.html')})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: its folder {folder} does not exist; create it "
                                "first, or name a file in a folder that does")
    return path


def write_page(page: str, path: str | os.PathLike[str]) -> str:
    """Write `page` to exactly `path` (replacing that file if it exists, atomically: a
    viewer never sees half a page); returns the path. A folder is refused, as is a path
    whose folder does not exist."""
    path = check_path(path)
    folder = os.path.dirname(os.path.abspath(path))
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else None
    # A new page gets the mode any new file gets (0o666 less the umask), as `open` would.
    tmp = os.path.join(folder, f".aioloader-report-{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        if mode is not None:  # a page written over keeps that file's mode
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
