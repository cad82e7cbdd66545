"""The disk tier's byte budget: entries within `max_bytes`, least recently used out first,
across every process that shares the directory, and a margin of the disk kept free.

A use stamps an entry's mtime; a writer over the budget rescans the directory (others write
and evict too) and evicts the oldest entries first, but never one used in the last `GRACE_S`
seconds (a worker may be about to open it by name). If that leaves no room, the new entry is
not stored: the budget holds, the read still succeeds. Room is checked and taken at once
(`take`): the disk threads write concurrently, and two that both saw room for one entry would
both write it. Only names of the cache's own patterns are counted or removed; entries
vanishing mid-scan are fine.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time

GRACE_S = 60.0  # an entry used this recently is never evicted
TEMP_STALE_S = 3600.0  # a temporary this old was left by a dead writer
FREE_MARGIN = 1 << 30  # keep at least this much (or 5% of the disk) free
ENTRY = re.compile(r"[0-9a-f]{40}\.seg")
TEMP = re.compile(r"\.[0-9a-f]{40}\.seg\.[0-9a-f]{16}\.tmp")


class DiskBudget:
    """At most `max_bytes` of entries in the directory `directory` (open as `dir_fd`)."""

    def __init__(self, directory: str, dir_fd: int, max_bytes: int) -> None:
        self.directory, self.dir_fd, self.max_bytes = directory, dir_fd, max_bytes
        self.evicted = self.refused = 0  # entries evicted; entries refused for want of room
        self._usage: int | None = None  # bytes of entries, as last scanned plus our writes
        self._lock = threading.RLock()
        self._pending = 0  # bytes of entries being written (room taken, not yet on disk)

    def usage(self) -> int:
        """Bytes of entries (and temporaries) in the directory now: one scan."""
        return sum(st.st_size for _, st in self._scan())

    def make_room(self, n: int) -> bool:
        """Whether `n` more bytes fit, after evicting entries not used for GRACE_S."""
        with self._lock:
            return self._make_room(n + self._pending)

    def take(self, n: int) -> bool:
        """Room for an entry of `n` bytes, taken until `written` (False: none, refused)."""
        with self._lock:
            if not self.make_room(n):
                self.refused += 1
                return False
            self._pending += n
            return True

    def written(self, n: int, stored: bool) -> None:
        """The entry `take` made room for is on disk (`stored`), or not (room given back)."""
        with self._lock:
            self._pending -= n
            if stored and self._usage is not None:
                self._usage += n

    def _scan(self) -> list[tuple[str, os.stat_result]]:
        """Our files in the directory (entries and temporaries), stale temporaries removed;
        files vanishing meanwhile are skipped."""
        out = []
        now = time.time()
        with os.scandir(self.dir_fd) as it:
            for e in it:
                temp = TEMP.fullmatch(e.name) is not None
                if not (temp or ENTRY.fullmatch(e.name)):
                    continue  # not ours: never counted, never removed
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if temp and now - st.st_mtime > TEMP_STALE_S:
                    with contextlib.suppress(OSError):
                        os.unlink(e.name, dir_fd=self.dir_fd)
                    continue
                out.append((e.name, st))
        return out

    def _make_room(self, n: int) -> bool:
        if n > self.max_bytes:
            return False
        if self._usage is not None and self._usage + n <= self.max_bytes and self._disk_ok(n):
            return True
        files = self._scan()  # others write and evict too: look again
        used = sum(st.st_size for _, st in files)
        old = time.time() - GRACE_S
        victims = sorted((st.st_mtime, name, st.st_size) for name, st in files
                         if name.endswith(".seg") and st.st_mtime < old)
        for _, name, size in victims:
            if used + n <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.dir_fd)
                self.evicted += 1
            used -= size
        self._usage = used
        return used + n <= self.max_bytes and self._disk_ok(n)

    def _disk_ok(self, n: int) -> bool:
        s = os.statvfs(self.directory)
        margin = max(FREE_MARGIN if s.f_blocks * s.f_frsize > 20 * FREE_MARGIN else 0,
                     s.f_blocks * s.f_frsize // 20)
        return s.f_bavail * s.f_frsize - n >= margin
