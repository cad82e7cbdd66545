"""The CPU pressure the tuner reads (`runtime.cpuload.stall_seconds`) is the process's own
cgroup's (cgroup v2 `cpu.pressure`, what a container's CPU limit makes others wait for) where
the kernel has one, else the machine's `/proc/pressure/cpu`; checked on this machine's real
files, skipped where it has neither."""

from __future__ import annotations

import os

import pytest

from aioloader.runtime import cpuload


def _own_cgroup_files() -> list[str]:
    """The cgroup v2 `cpu.pressure` files of this process's cgroup that exist (a unified
    mount, or the unified half of a hybrid one)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    paths = [ln[3:] for ln in lines if ln.startswith("0::")]
    found = []
    for p in paths:
        for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            path = os.path.normpath(root + p) + "/cpu.pressure"
            if os.path.isfile(path):
                found.append(path)
    return found


def _some_total(path: str) -> float:
    with open(path) as f:
        line = next(ln for ln in f if ln.startswith("some"))
    return int(line.rsplit("total=", 1)[1]) / 1e6


def test_the_pressure_is_the_cgroups_where_it_has_one():
    own = _own_cgroup_files()
    if not own:
        pytest.skip("no cgroup v2 cpu.pressure for this process")
    assert cpuload.pressure_path() == own[0]
    before = _some_total(own[0])
    got = cpuload.stall_seconds()
    after = _some_total(own[0])
    assert got is not None and before <= got <= after


def test_else_the_machines():
    if _own_cgroup_files():
        pytest.skip("this process's cgroup reports its own CPU pressure")
    if not os.path.isfile("/proc/pressure/cpu"):
        assert cpuload.pressure_path() is None and cpuload.stall_seconds() is None
        return
    assert cpuload.pressure_path() == "/proc/pressure/cpu"
    before = _some_total("/proc/pressure/cpu")
    got = cpuload.stall_seconds()
    assert got is not None and before <= got <= _some_total("/proc/pressure/cpu")
