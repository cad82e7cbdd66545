"""Reading a run report back (`aioloader.runtime.report`), as written or as a browser dumped
its DOM: the embedded JSON block, every element with its attributes, and the points each
plot drew (for tests with and without a browser)."""

from __future__ import annotations

import json
from collections import defaultdict
from html.parser import HTMLParser
from typing import Any

from aioloader.runtime.report import DATA_ID


class Page(HTMLParser):
    """Elements as (tag, attrs, the figure[data-plot] they are in); the JSON block; text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str], str | None]] = []
        self.blocks: dict[str, str] = {}
        self.text: list[str] = []
        self._figure: list[str | None] = []
        self._in: str | None = None  # the id of the script being read
        self._pre: list[str] | None = None
        self.pre: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        plot = a.get("data-plot") if tag == "figure" else None
        if tag == "figure":
            self._figure.append(plot)
        self.elements.append((tag, a, plot or next((p for p in reversed(self._figure) if p),
                                                    None)))
        if tag == "script":
            self._in = a.get("id", "")
            self.blocks.setdefault(self._in, "")
        if tag == "pre":
            self._pre = []

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag == "figure":
            self._figure.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure" and self._figure:
            self._figure.pop()
        if tag == "script":
            self._in = None
        if tag == "pre" and self._pre is not None:
            self.pre.append("".join(self._pre))
            self._pre = None

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self.blocks[self._in] += data
        else:
            self.text.append(data)
            if self._pre is not None:
                self._pre.append(data)

    @property
    def data(self) -> dict[str, Any]:
        return json.loads(self.blocks[DATA_ID])

    def points(self) -> dict[str, dict[str, list[tuple[float, float, float]]]]:
        """{plot id: {series: [(t, value, cy), ...]}}: the circles the script drew."""
        out: dict[str, dict[str, list[tuple[float, float, float]]]] = defaultdict(
            lambda: defaultdict(list))
        series = None
        for tag, a, plot in self.elements:
            if tag == "g" and "data-series" in a:
                series = a["data-series"]
            if tag == "circle" and plot is not None and series is not None:
                out[plot][series].append((float(a["data-t"]), float(a["data-v"]),
                                          float(a["cy"])))
        return out


def read(path: str) -> Page:
    with open(path, encoding="utf-8") as f:
        return Page(f.read())
