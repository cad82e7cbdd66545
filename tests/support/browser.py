"""Headless Chromium for the browser tests (tests/browser/, `make test-browser`): find it, dump a
page's DOM after its scripts ran, take a screenshot.

The tests run only where Chromium is found and AIOLOADER_BROWSER_TESTS=1 asks for them:
`make test-browser` installs Debian's chromium (or stops, saying how to get it) and sets the
variable; `make test` skips them.

Every run has its own profile folder (runs side by side share nothing), no sandbox (the test
machines run as root, where Chromium's sandbox refuses to start), and no network: every host
name resolves to nothing and every request goes to a closed proxy, so a page that needed a CDN
would show it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import pytest

ENV = "AIOLOADER_BROWSER_TESTS"
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1280, 900)  # a laptop's viewport


def _which() -> str | None:
    return os.environ.get("AIOLOADER_CHROMIUM") or next(
        (p for p in map(shutil.which, NAMES) if p), None)


requested = pytest.mark.skipif(
    os.environ.get(ENV) != "1" or _which() is None,
    reason=f"browser tests: make test-browser (Chromium, and {ENV}=1)")


def find() -> str:
    """The browser's path: $AIOLOADER_CHROMIUM, or the first of `NAMES` on PATH."""
    path = _which()
    if not path:
        pytest.fail("no Chromium found: `make test-browser` installs Debian's (apt-get install "
                    "-y chromium, as root), or set AIOLOADER_CHROMIUM=/path/to/chrome")
    return path


def _run(args: list[str], url: str, window: tuple[int, int], budget_ms: int) -> str:
    with tempfile.TemporaryDirectory(prefix="aioloader-chromium-") as profile:
        cmd = [find(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
               "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
               f"--window-size={window[0]},{window[1]}",
               f"--virtual-time-budget={budget_ms}", *args, url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def dump_dom(url: str, window: tuple[int, int] = WINDOW, budget_ms: int = 5000,
             extra: Sequence[str] = ()) -> str:
    """The page's DOM as serialized once its scripts ran (`--dump-dom`); `extra`: more
    switches (`--allow-file-access-from-files`, for a page that reads its iframes)."""
    return _run(["--dump-dom", *extra], url, window, budget_ms)


def screenshot(url: str, path: str, window: tuple[int, int] = WINDOW,
               budget_ms: int = 5000) -> str:
    """A PNG of the page's first `window` pixels."""
    _run([f"--screenshot={path}"], url, window, budget_ms)
    return path
