"""What aioloader logs: retries and hedges at DEBUG, rate-limited warnings, an INFO line at
open, and nothing else printed.

Failures are real: 503s and held answers come from the delay line in front of the local GCS
emulator (`aioloader.testing`), reads go through the real gs:// client.
"""

from __future__ import annotations

import ast
import itertools
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.io import retry
from aioloader.io.storage import RetryPolicy, Storage
from aioloader.logs import RateLimited
from aioloader.source import ArrayRecordSource
from aioloader.testing import local_gcs

N = 300
FAST = dict(base_delay=0.001, max_delay=0.01, hedge_after=None)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    path = tmp_path_factory.mktemp("logging") / "f.ar"
    with al.ArrayRecordWriter(str(path), group_size=1) as w:
        for i in range(N):
            w.write(b"record %d " % i * 20)
    with local_gcs(proxy=True) as gcs:
        gcs.upload(path, "f.ar")
        yield gcs
        gcs.set_faults()


async def _read_all(gcs, policy: RetryPolicy, **faults) -> Storage:
    storage = Storage(concurrency=16, storage_options=gcs.storage_options, retry=policy, seed=0)
    try:
        async with ArrayRecordSource(gcs.url("f.ar"), storage=storage, max_gap=0) as src:
            await src.aopen()
            gcs.set_faults(**faults)
            try:
                idx = np.random.default_rng(1).permutation(N)
                got = []
                for lo in range(0, N, 50):
                    got += await src.read(idx[lo : lo + 50])
            finally:
                gcs.set_faults()
            assert got == [b"record %d " % i * 20 for i in idx]
    finally:
        await storage.aclose()
    return storage


def _from(caplog, name: str, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == name and r.levelno == level]


async def test_retries_are_logged_at_debug_under_injected_503s(bucket, caplog):
    caplog.set_level(logging.DEBUG, logger="aioloader")
    storage = await _read_all(bucket, RetryPolicy(attempts=20, **FAST), error_rate=0.2,
                              statuses=(503,))
    retries = [r for r in _from(caplog, "aioloader.retry", logging.DEBUG)
               if "retrying" in r.getMessage()]
    assert storage.stats.retries > 10
    assert len(retries) == storage.stats.retries  # one line per retried attempt
    msg = retries[0].getMessage()
    assert "HTTP 503" in msg and "f.ar [" in msg and "attempt 1 failed" in msg, msg


async def test_many_attempts_warn_once_a_while(bucket, caplog):
    """At a 60% failure rate many reads need 4+ attempts: one WARNING says so, not one per
    read (rate-limited), and it names the file and the cause."""
    caplog.set_level(logging.WARNING, logger="aioloader")
    await _read_all(bucket, RetryPolicy(attempts=40, **FAST), error_rate=0.6, statuses=(503,))
    warned = _from(caplog, "aioloader.retry", logging.WARNING)
    assert len(warned) == 1, [r.getMessage() for r in warned]
    msg = warned[0].getMessage()
    assert "f.ar" in msg and "attempts" in msg and "HTTP 503" in msg, msg


async def test_a_slow_store_warns(bucket, caplog, monkeypatch):
    monkeypatch.setattr(retry, "SLOW_S", 0.01)  # the delay line holds every answer 30 ms
    caplog.set_level(logging.WARNING, logger="aioloader")
    await _read_all(bucket, RetryPolicy(**FAST), hold_rate=1.0, hold_s=0.03)
    warned = [r.getMessage() for r in _from(caplog, "aioloader.retry", logging.WARNING)]
    assert len(warned) == 1 and "the store is slow" in warned[0], warned


async def test_hedges_are_logged_at_debug(bucket, caplog):
    caplog.set_level(logging.DEBUG, logger="aioloader")
    policy = RetryPolicy(base_delay=0.001, hedge_after=0.05, hedge_budget=1.0)
    storage = await _read_all(bucket, policy, hold_first=3, hold_s=1.0)
    sent = [r for r in _from(caplog, "aioloader.retry", logging.DEBUG)
            if "sent a hedge" in r.getMessage()]
    assert storage.stats.hedges >= 1 and len(sent) == storage.stats.hedges
    assert "f.ar [" in sent[0].getMessage()


def test_opening_a_dataset_logs_what_it_is(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="aioloader")
    for k, opts in enumerate(["group_size:1", "group_size:8,brotli:6"]):
        with al.ArrayRecordWriter(str(tmp_path / f"x{k}.ar"), options=opts) as w:
            for i in range(20):
                w.write(b"%d" % i)
    ds = al.Dataset.from_arrayrecord(str(tmp_path / "*.ar")).batch(10)
    assert sum(1 for _ in ds.loader()) == 4
    (line,) = [r.getMessage() for r in _from(caplog, "aioloader.source", logging.INFO)]
    assert "2 files, 40 records" in line, line
    assert "brotli:6 (1 file), zstd:3 (1 file)" in line and "group size 1 (1 file), 8 (1 file)" \
        in line, line


def test_nothing_prints_outside_the_cli():
    """No print() in the library: what it has to say goes to the log (the CLI's commands,
    tools/cli*.py, and the delay line's `python -m` entry point print)."""
    root = Path(al.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        where = path.relative_to(root)
        if where.match("tools/cli*.py") or where == Path("testing/delayline.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, found


@given(st.lists(st.integers(0, 10_000), max_size=50), st.integers(1, 5_000))
def test_rate_limited_lines_are_spaced_and_counted(steps, every):
    """Lines go out at least `every` apart, and every call is either a line or counted in
    the next line that goes out (whole milliseconds: no float rounding in the check)."""
    log = logging.getLogger("aioloader.test-rate")
    log.setLevel(logging.WARNING)
    log.propagate = False
    now = [0]
    limited = RateLimited(log, every=every, clock=lambda: now[0])
    out, told = [], 0
    for step in steps:
        now[0] += step
        held = limited.held
        if limited("x"):
            out.append(now[0])
            told += held
    assert all(b - a >= every for a, b in itertools.pairwise(out))
    assert len(out) + told + limited.held == len(steps)
    if steps:
        assert out[0] == steps[0]  # the first goes out at once
