"""What the machine says about its CPUs beyond this process: idle time and CPU pressure.

The tuner (`runtime.tuner`) samples both each look and turns their changes into the
controller's `cores_free` (at most the cores nobody used: a competing load that takes them
leaves none, so no worker is added to queue behind it) and `cpu_pressure` (the share of the
interval some runnable task waited for a CPU). Both are cumulative counters, read from Linux
`/proc/stat` (the CPUs this process may run on) and PSI: the process's own cgroup v2
`cpu.pressure` where the kernel has one (in a container, the waiting its CPU limit causes),
else the machine's `/proc/pressure/cpu`; None where the system has neither, and the
controller then goes by this process's own figures.
"""

from __future__ import annotations

import functools
import os

__all__ = ["idle_seconds", "pressure_path", "stall_seconds"]

_CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")  # unified; hybrid's v2 half
_MACHINE_PRESSURE = "/proc/pressure/cpu"

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _allowed() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def idle_seconds() -> float | None:
    """CPU-seconds spent idle (idle + iowait) so far, summed over the CPUs this process may
    run on; None where /proc/stat cannot be read."""
    allowed = _allowed()
    total = 0.0
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                if not name[3:].isdigit() or len(fields) < 5:
                    continue
                if allowed is not None and int(name[3:]) not in allowed:
                    continue
                total += int(fields[3]) + int(fields[4])
    except (OSError, ValueError):
        return None
    return total / _TICK


@functools.cache
def pressure_path() -> str | None:
    """The PSI file `stall_seconds` reads: this process's cgroup v2 `cpu.pressure` where it
    exists, else `/proc/pressure/cpu` where that does, else None. Chosen once, so that
    successive readings are of one counter."""
    try:
        with open("/proc/self/cgroup") as f:
            groups = [ln[3:].rstrip("\n") for ln in f if ln.startswith("0::")]
    except OSError:
        groups = []
    for group in groups:
        for root in _CGROUP_ROOTS:
            path = os.path.normpath(root + group) + "/cpu.pressure"
            if os.path.isfile(path):
                return path
    return _MACHINE_PRESSURE if os.path.isfile(_MACHINE_PRESSURE) else None


def stall_seconds() -> float | None:
    """Seconds so far in which some runnable task of this process's cgroup (or, without
    one, of the machine) waited for a CPU (PSI `some total`); None where the kernel does
    not report CPU pressure."""
    path = pressure_path()
    if path is None:
        return None
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("some"):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return None
