"""The run report without a browser: the page holds the run's data (the plots' points are the
timeline's rates, the table is `str(stats)`, the legend is the table's), loads nothing from the
network, holds no credential, and is written to exactly the path given. (tests/browser/ opens
it in Chromium and checks what the script drew.)"""

import html
import os
import re
import time

import pytest

import aioloader as al
from aioloader.runtime.report import DATA_ID, write_page
from aioloader.runtime.stats import PipelineStats
from aioloader.runtime.table import LEGEND
from aioloader.runtime.timeline import rates
from tests.support.report_page import read

PLOTS = ["batches", "wait", "busy", "reads", "cache", "retries"]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _stats(graph=("source(/data/x.array_record)", "batch(8)"), io=None) -> PipelineStats:
    """Two seconds of a loader: 16 batches, the workers busy half the time, 2 reads in
    flight, 3 retries in the second second, cache hits."""
    clock = Clock()
    figures = {"reads": 0, "bytes": 0, "retries": 0, "busy_seconds": 0.0, **(io or {})}
    cache = {"hits": 0, "misses": 0}
    ps = PipelineStats(workers=2, prefetch=4, graph=list(graph), clock=clock,
                       io_source=lambda: dict(figures), cache_source=lambda: dict(cache))
    for k in range(16):
        clock.t += 0.125
        ps.process.add(8, 0.125)  # one of 2 workers busy: 50%
        figures["reads"] += 1
        figures["busy_seconds"] += 0.25
        figures["retries"] += 1 if k in (9, 10, 11) else 0
        cache["hits"] += 2
        ps.records += 8
        ps.note_batch(0.0125 if k < 8 else 0.0, ready=2)
    return ps


def test_the_page_holds_the_runs_data_and_the_plots_are_the_timelines_rates(tmp_path):
    ps = _stats()
    path = ps.report(tmp_path / "report.html")
    assert path == str(tmp_path / "report.html")
    page = read(path)
    data = page.data
    assert data["version"] == 1 and data["summary"]["batches"] == 16
    assert [p["id"] for p in data["plots"]] == PLOTS
    # one figure per plot, each with its caption, for the script to draw into
    figures = [a["data-plot"] for tag, a, _ in page.elements if tag == "figure"]
    assert figures == PLOTS
    r = rates(data["samples"], list(ps.stages))
    plots = {p["id"]: p for p in data["plots"]}
    for p in data["plots"]:
        assert p["t"] == r["t"] and len(p["t"]) >= 4
        assert all(len(s["values"]) == len(p["t"]) for s in p["series"])
    values = {pid: {s["name"]: s["values"] for s in p["series"]} for pid, p in plots.items()}
    assert values["batches"]["batches/s"] == pytest.approx([8.0] * len(r["t"]))
    assert values["wait"]["waited"][:2] == pytest.approx([10.0, 10.0])
    assert values["wait"]["waited"][-1] == 0.0
    assert list(values["busy"]) == ["decode+transform"]  # the stages that did anything
    assert values["busy"]["decode+transform"] == pytest.approx([50.0] * len(r["t"]))
    assert values["reads"]["reads in flight"] == pytest.approx([2.0] * len(r["t"]))
    assert values["cache"]["hits/s"] == pytest.approx([16.0] * len(r["t"]))
    assert values["retries"]["retries"][0] == 0 and values["retries"]["retries"][-1] == 3
    assert (plots["wait"]["max"], plots["busy"]["max"], plots["batches"]["max"]) == (
        100.0, 100.0, None)
    # the table and its legend, as print(it.stats()) and .legend() give them
    assert data["table"] == str(ps)
    assert page.pre == [str(ps)]
    assert data["legend"] == [list(e) for e in LEGEND]
    text = html.unescape("".join(page.text))
    for label, meaning in LEGEND:
        assert label in text and meaning in text


def test_the_page_needs_no_network(tmp_path):
    path = _stats().report(tmp_path / "net.html")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    page = read(path)
    for tag, a, _ in page.elements:
        assert tag not in ("link", "img", "iframe", "object", "embed"), tag
        for key in ("src", "href", "xlink:href", "data"):
            assert key not in a or not a[key], (tag, a)
    assert not re.search(r"@import|url\(", text)
    scripts = [a for tag, a, _ in page.elements if tag == "script"]
    assert [a.get("id") for a in scripts] == [DATA_ID, None]


SECRETS = ("hunter2", "SIGNATURE-VALUE", "ya29.TOKEN")


def test_the_page_holds_no_credential(tmp_path):
    graph = ["source(https://alice:hunter2@storage.example.com/b/x.array_record?"
             "X-Goog-Signature=SIGNATURE-VALUE&X-Goog-Credential=ya29.TOKEN)", "batch(8)"]
    io = {"statuses": {"gs://b/x.array_record?access_token=ya29.TOKEN: 503": 1}}
    ps = _stats(graph=graph, io=io)
    with open(ps.report(tmp_path / "r.html"), encoding="utf-8") as f:
        text = f.read()
    for secret in SECRETS:
        assert secret not in text, secret
    # what is not secret stays: where the data came from, the parameters' names
    assert "storage.example.com/b/x.array_record" in text and "X-Goog-Signature" in text
    data = read(str(tmp_path / "r.html")).data
    assert "X-Goog-Signature=***" in data["table"]


def test_it_writes_exactly_the_path_given(tmp_path):
    ps = _stats()
    keep = tmp_path / "report.html.tmp"  # a name a careless writer would use
    keep.write_text("mine")
    target = tmp_path / "report.html"
    target.write_text("old report")
    os.chmod(target, 0o640)
    ps.report(str(target))
    assert target.read_text().startswith("<!doctype html>")
    assert os.stat(target).st_mode & 0o777 == 0o640  # replaced, as it was shared
    assert sorted(os.listdir(tmp_path)) == ["report.html", "report.html.tmp"]
    assert keep.read_text() == "mine"


def test_a_folder_or_a_missing_folder_is_refused(tmp_path):
    ps = _stats()
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError, match=r"is a folder.*report\.html"):
        ps.report(tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ps.report(tmp_path / "nowhere" / "r.html")
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_real_run_reports_what_it_did(tmp_path):
    path = tmp_path / "d.array_record"
    with al.ArrayRecordWriter(path, group_size=8) as w:
        for i in range(640):
            w.write(bytes([i % 251]) * 200)
    ds = al.Dataset.from_arrayrecord(str(path)).shuffle(3).map(len).batch(16)
    with ds.loader(workers=0, prefetch=2) as it:
        for _ in it:
            time.sleep(0.03)  # a training step: 40 batches, about 1.2 s
        out = it.stats().report(tmp_path / "run.html")
        table = str(it.stats())
    data = read(out).data
    assert data["summary"]["batches"] == 40 and data["summary"]["records"] == 640
    t = data["plots"][0]["t"]
    assert len(t) >= 2 and t == sorted(t)
    batches = data["plots"][0]["series"][0]["values"]
    spans = [b - a for a, b in zip([0.0, *t], t)]
    assert sum(v * dt for v, dt in zip(batches, spans)) == pytest.approx(40)
    assert data["samples"][-1]["batches"] == 40
    # the table as printed then, bar the clock's figures
    assert data["table"].splitlines()[0] == table.splitlines()[0]


def test_a_new_page_gets_the_mode_the_umask_gives_and_an_old_one_keeps_its_own(tmp_path):
    old = os.umask(0o077)
    try:
        new = write_page("<html></html>", tmp_path / "new.html")
    finally:
        os.umask(old)
    assert os.stat(new).st_mode & 0o777 == 0o600
    kept = tmp_path / "kept.html"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    write_page("<html></html>", kept)
    assert os.stat(kept).st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
