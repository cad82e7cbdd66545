"""A worker process's start: the forkserver workers fork from starts with the first loader
that has workers (or at `aioloader.warm_up()`), and it and its workers load only the worker's
side of the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aioloader as al

from ..support import worker_start_fns as fns

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forkserver: Linux")


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> list[str]:
    p = tmp_path_factory.mktemp("start") / "r.array_record"
    with al.ArrayRecordWriter(p, group_size=1) as w:
        for i in range(64):
            w.write(bytes(i + 1))
    return [str(p)]


def test_workers_load_only_the_workers_side_of_the_package(path):
    ds = al.Dataset.from_arrayrecord(path).map(fns.loaded).batch(16)
    with ds.loader(workers=2, first_in_parent=False) as it:  # (every task in a worker)
        batches = list(it)
    assert len(batches) == 4
    assert all(b["pid"][0] != os.getpid() for b in batches)  # ran in workers
    assert not any(b["parent_side"].any() for b in batches), "a worker loaded the parent's side"
    assert not any(b["asyncio"].any() for b in batches), "a worker loaded asyncio"


def test_a_transform_subclassing_the_packages_classes_loads_in_workers(path):
    """`aioloader` in a worker loads its public names on first use (`al.Map` here, used by
    the transform's module as it is imported)."""
    ds = al.Dataset.from_arrayrecord(path).shuffle(1).map(fns.Length()).batch(8)
    with ds.loader(workers=0) as it:
        ref = [np.array(b) for b in it]
    with ds.loader(workers=2) as it:
        got = [np.array(b) for b in it]
    assert [a.tolist() for a in got] == [b.tolist() for b in ref]
    assert sorted(np.concatenate(got).tolist()) == list(range(1, 65))


SCRIPT = """
import json, os, sys
import aioloader as al
early = "aioloader.workers.server" in sys.modules
import tests.support.worker_start_fns as fns
ds = al.Dataset.from_arrayrecord(sys.argv[1:]).map(fns.loaded).batch(64)
loader = ds.loader(workers=1, first_in_parent=False)
from aioloader.workers import server
made = server.server_pid()
with loader as it:
    parent_side = bool(next(iter(it))["parent_side"].any())
print(json.dumps({"early": early, "marker": "_AIOLOADER_WORKER_PROCESS" in os.environ,
                  "parent_side": parent_side,
                  "same_server": made is not None and server.server_pid() == made}))
"""


def _run(env: dict, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=REPO, capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_server_starts_with_the_first_loader_and_its_workers_load_only_their_side(path):
    """Not at `import aioloader` (tests/test_import.py), but when a loader with workers is
    made; the pool uses that server, the parent's environment keeps no worker marker, and
    the workers load only their side of the package."""
    got = _run({}, *path)
    assert got == {"early": False, "marker": False, "parent_side": False, "same_server": True}


def test_workers_see_the_environment_of_when_the_loader_was_made(path, monkeypatch):
    """The forkserver (and so a fork of it) has the environment of when it started; the
    pool hands each worker the parent's as it is when the loader is made."""
    monkeypatch.setenv("AIOLOADER_TEST_ENV", "7")
    ds = al.Dataset.from_arrayrecord(path).map(fns.env_value).batch(64)
    with ds.loader(workers=1, first_in_parent=False) as it:
        assert next(iter(it)).tolist() == [7] * 64


_THRESHOLDS = r"""
import ctypes, json, resource
from aioloader.workers.worker import _raise_malloc_thresholds
import numpy as np

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks "
                "fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
_raise_malloc_thresholds()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
mapped = libc.mallinfo2().hblks
blocks = [np.empty(1 << 20, np.uint8) for _ in range(4)]
print(json.dumps({"faults": faults, "mapped": libc.mallinfo2().hblks - mapped}))
"""


@pytest.mark.skipif(not os.path.exists("/lib/x86_64-linux-gnu/libc.so.6")
                    and not os.path.exists("/lib/aarch64-linux-gnu/libc.so.6"),
                    reason="glibc's malloc")
def test_raising_malloc_thresholds_moves_mid_size_buffers_to_the_heap_without_touching_16_mib():
    """Every worker (and workers=0's thread) does this at start, on the first batch's path:
    a 1 MiB buffer must come from the heap afterwards (not its own mmap), and doing it must
    not fault 16 MiB of zeroed pages in (it took 10-13 ms, a third of a round trip)."""
    out = subprocess.run([sys.executable, "-c", _THRESHOLDS], capture_output=True, text=True,
                         check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["mapped"] == 0, "1 MiB buffers are still mmapped: thresholds not raised"
    assert got["faults"] < 1024, f"{got['faults']} pages faulted in (16 MiB is 4,096)"
