"""Telling our worker processes from multiprocessing's own helpers in leak checks."""

from __future__ import annotations

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
