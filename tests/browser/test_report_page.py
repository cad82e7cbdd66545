"""The run report in headless Chromium, with no network: the page's script drew every plot, one
circle per point of its data, at the time and value the data holds, higher values higher."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path

import pytest

import aioloader as al
from tests.support import browser
from tests.support.report_page import Page

pytestmark = [pytest.mark.browser, browser.requested]


def _report(tmp_path: Path) -> Path:
    """A small loader's report: 60 batches, a training step of 20 ms each (about 1.5 s)."""
    path = tmp_path / "d.array_record"
    with al.ArrayRecordWriter(path, group_size=8) as w:
        for i in range(960):
            w.write(bytes([i % 251]) * 300)
    ds = al.Dataset.from_arrayrecord(str(path)).shuffle(5).map(len).batch(16)
    with ds.loader(workers=0, prefetch=2) as it:
        for _ in it:
            time.sleep(0.02)
        return Path(it.stats().report(tmp_path / "report.html"))


def test_the_report_draws_every_point_of_its_data(tmp_path):
    report = _report(tmp_path)
    page = Page(browser.dump_dom(report.as_uri()))
    body = next(a for tag, a, _ in page.elements if tag == "body")
    data = page.data
    assert body.get("data-plots-drawn") == str(len(data["plots"])) == "6"
    drawn = page.points()
    svgs = {plot: a for tag, a, plot in page.elements if tag == "svg"}
    for plot in data["plots"]:
        t = plot["t"]
        assert len(t) >= 2, plot["id"]
        assert svgs[plot["id"]]["data-points"] == str(len(t))
        assert list(drawn[plot["id"]]) == [s["name"] for s in plot["series"]], plot["id"]
        for series in plot["series"]:
            points = drawn[plot["id"]][series["name"]]
            assert [(pt, v) for pt, v, _ in points] == list(zip(t, series["values"])), \
                (plot["id"], series["name"])
            # SVG's y grows downwards: a higher value is drawn higher, equal ones level
            for (_, v1, y1), (_, v2, y2) in pairwise(sorted(points, key=lambda p: p[1])):
                assert y2 < y1 if v2 > v1 else y2 == pytest.approx(y1), plot["id"]
    lines = [a for tag, a, _ in page.elements if tag == "polyline"]
    assert len(lines) == sum(len(p["series"]) for p in data["plots"])
    # the table and the legend are on the page as written
    assert data["table"] in page.pre
    assert "What the table's columns and lines mean" in "".join(page.text)
