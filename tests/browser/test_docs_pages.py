"""The documentation site in headless Chromium: on every page, at a laptop's and at a narrow
window's width, no table is wider than the text column (the theme would cut it at the right
edge behind a sideways scroll bar) and the page itself does not scroll sideways; the API page's
`Dataset` reads as a newcomer needs it (constructors first, no internal fields).

`make test-browser` builds the site first (`make docs`) and passes it in AIOLOADER_SITE; without
it the test builds its own. Each page is measured inside an iframe of one harness page, so one
browser run checks them all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import browser
from tests.support.report_page import Page

pytestmark = [pytest.mark.browser, browser.requested]

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (1280, 800)
SKIP = {"404.html", "search.html"}

# Measures each iframe's page once it loaded (the theme's scripts ran): every table's width
# against what it shows (scrollWidth/clientWidth: the theme makes a table a box that scrolls
# sideways) and against the text column's right edge, and the page's own sideways scroll.
HARNESS = """<!doctype html><html><body><pre id="out"></pre><script>
var pages = %(pages)s, widths = %(widths)s, results = [], left = pages.length * widths.length;
function measure(frame, page, width) {
  var doc = frame.contentDocument, row = {page: page, width: width, tables: []};
  if (!doc) { row.error = "no access to the page"; return row; }
  var main = doc.querySelector("[role=main]") || doc.body;
  row.edge = main.getBoundingClientRect().right;
  row.pageScroll = doc.documentElement.scrollWidth;
  row.pageWidth = doc.documentElement.clientWidth;
  doc.querySelectorAll("table").forEach(function (t) {
    row.tables.push({head: t.innerText.slice(0, 60), scroll: t.scrollWidth,
                     client: t.clientWidth, right: t.getBoundingClientRect().right});
  });
  var d = doc.getElementById("aioloader.Dataset");
  if (d) {
    var ids = Array.prototype.map.call(doc.querySelectorAll('[id^="aioloader.Dataset."]'),
                                       function (e) { return e.id; });
    var first = doc.getElementById("aioloader.Dataset.from_arrayrecord");
    var range = doc.createRange();
    range.setStartBefore(d);
    range.setEndBefore(first);
    row.dataset = {members: ids, lead: range.toString(),
                   firstSignature: first.parentElement.querySelector("pre, code")
                     ? first.parentElement.querySelector("pre, code").innerText : ""};
  }
  return row;
}
pages.forEach(function (page) {
  widths.forEach(function (width) {
    var frame = document.createElement("iframe");
    frame.style.width = width + "px";
    frame.style.height = "900px";
    frame.onload = function () {
      setTimeout(function () {
        results.push(measure(frame, page, width));
        if (--left === 0) document.getElementById("out").textContent = JSON.stringify(results);
      }, 100);
    };
    frame.src = page;
    document.body.appendChild(frame);
  });
});
</script></body></html>
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("site")
    built = os.environ.get("AIOLOADER_SITE")
    if built:  # (copied: the harness page is written into it)
        shutil.copytree(built, dest, dirs_exist_ok=True)
    else:
        pytest.importorskip("mkdocs")
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                        "--site-dir", str(dest)], cwd=ROOT, check=True, timeout=240)
    return dest


def _measure(site: Path) -> list[dict]:
    pages = sorted(str(p.relative_to(site)) for p in site.rglob("*.html")
                   if p.name not in SKIP and "search" not in p.parts)
    harness = site / "aioloader-layout-check.html"
    harness.write_text(HARNESS % {"pages": json.dumps(pages), "widths": json.dumps(WIDTHS)})
    dom = browser.dump_dom(harness.as_uri(), budget_ms=20000,
                           extra=["--allow-file-access-from-files"])
    out = "".join(Page(dom).pre)
    assert out, "the harness measured nothing (did every page load?)"
    rows = json.loads(out)
    assert len(rows) == len(pages) * len(WIDTHS) and "api/index.html" in pages
    return rows


def test_no_table_is_cut_and_the_api_page_leads_with_the_constructors(site):
    rows = _measure(site)
    cut = []
    for row in rows:
        assert "error" not in row, row
        where = f"{row['page']} at {row['width']} px"
        if row["pageScroll"] > row["pageWidth"] + 1:
            cut.append(f"{where}: the page scrolls sideways ({row['pageScroll']} px)")
        for t in row["tables"]:
            if t["scroll"] > t["client"] + 1 or t["right"] > row["edge"] + 1:
                cut.append(f"{where}: table {t['head']!r} is {t['scroll']} px wide in "
                           f"{t['client']} px")
    assert not cut, "\n".join(cut)
    tables = sum(len(r["tables"]) for r in rows)
    assert tables >= 4  # (the measure found the tables the pages have)
    api = next(r for r in rows if r["page"] == "api/index.html" and r["width"] == 1280)
    ds = api["dataset"]
    assert ds["members"][0] == "aioloader.Dataset.from_arrayrecord"
    assert ds["firstSignature"].startswith("from_arrayrecord(")
    for internal in ("index_ops", "batch_ops", "SourceSpec", "source:", "Stages"):
        assert internal not in ds["lead"], internal
