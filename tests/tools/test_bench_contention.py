"""The contention benchmark's CPU hog (benchmarks/bench_contention.py) never outlives the
benchmark: killed politely (SIGTERM) or not (SIGKILL), the hog processes it started are gone
within a couple of seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, or a pid reused by another program, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            hog = b"duty" in f.read()
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and hog


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_hog_survives_the_benchmark_killed(sig):
    script = (
        "import time\n"
        "from benchmarks.bench_contention import hog\n"
        "with hog(2, 0.5) as pids:\n"
        "    print(*pids, flush=True)\n"
        "    time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env,
                             text=True)
    try:
        assert child.stdout is not None
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        child.send_signal(sig)
        child.wait(timeout=10)
        deadline = time.monotonic() + 2.0
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = [p for p in pids if _alive(p)]
        for p in survivors:  # (not to leave them spinning when the test fails)
            os.kill(p, signal.SIGKILL)
        assert not survivors
        # SIGTERM: the benchmark's own cleanup ran (SystemExit); SIGKILL: the hogs saw it go.
        assert child.returncode == (128 + sig if sig == signal.SIGTERM else -sig)
    finally:
        child.kill()
        child.wait()
