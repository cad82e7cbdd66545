"""The worker server and its workers, seen from a user's script run as its own process:
workers never run the script again (no `if __name__ == "__main__":` guard needed), and a
parent killed by a signal leaves no multiprocessing directory behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import aioloader as al

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forkserver: Linux")

# README's first example as a plain script (a local file, no sharding, no JAX): no guard.
README_SCRIPT = """
import json
import numpy as np
import aioloader as al
print("BODY RAN", flush=True)

def featurize(d):
    return {"x": np.asarray(d["x"], np.int64)}

ds = (al.Dataset.from_arrayrecord(DATA)
        .shuffle(seed=42).repeat(2)
        .map(json.loads).map(featurize)
        .batch(8, drop_remainder=True))

total = 0
for batch in ds.loader(workers=2):
    total += int(batch["x"].sum())
print("TOTAL", total)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("server") / "train-0.array_record"
    with al.ArrayRecordWriter(p, group_size=1) as w:
        for i in range(64):
            w.write(json.dumps({"x": [i, 2 * i]}).encode())
    return p


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **more}


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_an_unguarded_script_runs_once_with_worker_processes(data, tmp_path, how):
    """`python script.py` and `python - < script.py`, workers=2: workers do not import the
    script (its body runs once), and the batches are right."""
    script = tmp_path / "train.py"
    script.write_text(f"DATA = {str(data)!r}\n" + README_SCRIPT)
    if how == "file":
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path, env=_env())
    else:
        out = subprocess.run([sys.executable, "-"], input=script.read_text(),
                             capture_output=True, text=True, timeout=120, cwd=tmp_path,
                             env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("BODY RAN") == 1, out.stdout
    assert "bootstrapping" not in out.stderr, out.stderr[-3000:]
    assert f"TOTAL {2 * 3 * sum(range(64))}" in out.stdout, out.stdout


KILLED_CHILD = """
import sys, time
import aioloader as al

if __name__ == "__main__":
    ds = al.Dataset.from_arrayrecord(sys.argv[1]).repeat().batch(8)
    loader = ds.loader(workers=2)
    it = iter(loader)
    next(it)
    loader.pool.wait_started(30)  # (the first batch may come before the workers are up)
    print("READY", flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_parent_killed_by_a_signal_leaves_no_multiprocessing_directory(data, sig):
    """multiprocessing's `pymp-*` directory (which holds the worker server's socket) is the
    parent's to remove at exit: killed, it cannot, and the server removes it as it exits."""
    # A short TMPDIR of its own: the socket's path must fit AF_UNIX's 108 bytes, which
    # pytest's tmp_path under xdist does not.
    tmp = Path(tempfile.mkdtemp(prefix="al-", dir="/tmp"))
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(data)],
                             stdout=subprocess.PIPE, text=True, env=_env(TMPDIR=str(tmp)))
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        assert any(n.startswith("pymp-") for n in os.listdir(tmp))  # (what is checked)
        child.send_signal(sig)
        child.wait(30)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while any(n.startswith("pymp-") for n in os.listdir(tmp)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [n for n in os.listdir(tmp) if n.startswith("pymp-")]
    shutil.rmtree(tmp, ignore_errors=True)
    assert not left
