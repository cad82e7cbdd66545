"""Leak checks across processes: our worker processes (not multiprocessing's own helpers),
and the shared-memory files and memory files processes hold."""

from __future__ import annotations

import contextlib
import os

import psutil


def is_stdlib_helper(cmdline: str, ppid: int, owner: int) -> bool:
    """multiprocessing's resource tracker and forkserver (a child of `owner`, the process
    that made the pool): started once per interpreter and alive until it exits, they are the
    stdlib's, not workers we leaked. Workers forked by the forkserver share its command line
    but are its children, so they still count."""
    return "resource_tracker" in cmdline or ("forkserver" in cmdline and ppid == owner)


def worker_pids(owner: psutil.Process) -> set[int]:
    """`owner`'s descendants that are not multiprocessing's helpers."""
    out = set()
    for p in owner.children(recursive=True):
        try:
            if not is_stdlib_helper(" ".join(p.cmdline()), p.ppid(), owner.pid):
                out.add(p.pid)
        except psutil.Error:
            continue
    return out


def shm_files(pids: set[int]) -> set[str]:
    """The /dev/shm files `pids` have mapped or open (what they would leave behind if the
    kernel did not free it with them)."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(None, 5)
                    name = fields[5].strip() if len(fields) > 5 else ""
                    if name.startswith("/dev/shm/") and not name.endswith("(deleted)"):
                        out.add(name)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/") and not target.endswith("(deleted)"):
                    out.add(target)
        except OSError:
            continue
    return out


def memory_files(pid: int, name: str = "aioloader") -> int:
    """How many descriptors and maps of `pid` hold one of our memory files (memfd or shm)."""
    n = 0
    try:
        with open(f"/proc/{pid}/maps") as f:
            n += sum(name in line for line in f)
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                n += name in os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        pass
    return n
