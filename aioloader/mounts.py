"""Which kind of file system a directory lies on, read from /proc/self/mounts: a file the
loader writes for itself (the spill of decoded records) must not go to one held in memory
(tmpfs), where its bytes would be RAM outside `memory_budget`."""

from __future__ import annotations

import os

MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs"})  # file systems held in memory


def in_memory(directory: str) -> bool:
    """Whether `directory` lies on a file system held in memory (tmpfs), by the longest
    mount point over it in /proc/self/mounts; False where that cannot be read."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return False
    where = os.path.realpath(directory)
    best, kind = "", ""
    for point, fs in mounts:
        point = point.replace("\\040", " ")
        if (where == point or where.startswith(point.rstrip("/") + "/")) and \
                len(point) >= len(best):
            best, kind = point, fs
    return kind in MEMORY_FS
