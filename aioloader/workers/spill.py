"""The decoded-record spill of an exact shuffle over large chunks: each chunk's decoded records
written once to a local file by the fill job that first decodes it, so that its later fills
(the loader's later horizons and epochs, `runtime.horizons`) copy their wanted records out of
it instead of decoding the chunk again. An epoch then costs one decode of each chunk and a
copy of each record, however many horizons the decoded-chunk cache cuts it into; the disk
holds the chunks' decoded bytes for the loader's life.

`SpillFile` is the parent's: a file made already unlinked (`O_TMPFILE`, or a name removed at
once) in a directory of local disk, kept open, so nothing is left behind when the loader
closes, the process exits or is killed; the regions it reserved; and which of them a job
reported fully written (only those are ever read). Workers of this host (processes, threads,
the inline one) open it per job through `/proc/<pid>/fd/<fd>`. A region is written with
`pwrite` (a full disk is an `OSError` the job reports, never a signal as a written map would
give); what is read back is checked (record count, lengths, ascending offsets within the
region) before a record is copied out, and a region that fails is decoded again.

A region: records n and data bytes m (int64 each), the chunk's n + 1 record offsets (int64),
then its m bytes of records.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import tempfile
import weakref
from typing import Any

import numpy as np

from .messages import SPILL_REFUSED, Spill

HEAD = 16  # records n, data bytes m
ALIGN = mmap.ALLOCATIONGRANULARITY  # regions start where a map may
MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


def region_bytes(records: Any, decoded: Any) -> Any:
    """The bytes a region of a chunk of `records` records decoding to `decoded` bytes takes
    (aligned to where the next may start); elementwise over arrays."""
    need = HEAD + 8 * (np.asarray(records, dtype=np.int64) + 1) + \
        np.asarray(decoded, dtype=np.int64)
    return (need + ALIGN - 1) // ALIGN * ALIGN


class SpillFile:
    """The parent's side: the unlinked file (`path` opens it from any process of this
    host), at most `max_bytes` of regions reserved in it, one per chunk key, and the
    figures for `stats()` (`written` bytes, `hits`: fills served, decodes avoided)."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.reserved = 0
        self.written = 0
        self.hits = 0
        self.refused = False  # a write failed (a full disk): no more are tried
        self._at: dict[Any, tuple[int, int, int]] = {}  # key -> offset, room, records
        self._done: dict[Any, int] = {}  # key -> bytes written (readable)
        self._fd: int | None = _unlinked(directory)
        self.path = f"/proc/{os.getpid()}/fd/{self._fd}"
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        st = os.fstat(self._fd)
        self.ident = (st.st_dev, st.st_ino)
        if not os.path.exists(self.path):  # (no /proc: workers could not open it)
            self.close()
            raise OSError(errno.ENOENT, "no /proc/<pid>/fd to share the spill file by")

    def job(self, key: Any, records: int, decoded: int) -> Spill | None:
        """The spill part of a fill job of chunk `key`: read its region when written, else
        write it if there is room (a region is reserved once); None: neither."""
        if self._fd is None:
            return None
        done = self._done.get(key)
        at = self._at.get(key)
        if done is not None and at is not None:
            return Spill(self.path, at[0], done, at[2], False, self.ident)
        if self.refused:
            return None
        if at is None:
            room = int(region_bytes(records, decoded))
            if self.reserved + room > self.max_bytes:
                return None
            at = self._at[key] = (self.reserved, room, int(records))
            self.reserved += room
        return Spill(self.path, at[0], at[1], at[2], True, self.ident)

    def outcome(self, key: Any, job: Spill, spilled: int) -> None:
        """What a job with `job` reported (`Result.spilled`)."""
        if job.write:
            if spilled > 0:
                self._done[key] = spilled
                self.written += spilled
            elif spilled == SPILL_REFUSED:
                self.refused = True
        elif spilled < 0:  # read back wrong: never read again (the chunk is decoded)
            self._done.pop(key, None)
        else:
            self.hits += 1

    def figures(self) -> dict[str, int]:
        return {"spill_bytes": self.written, "spill_hits": self.hits}

    def close(self) -> None:
        """Let the file go (the workers' descriptors are per job). Idempotent."""
        self._fd = None
        self._finalizer()


def _unlinked(directory: str) -> int:
    """A new file of ours in `directory`, open for reading and writing, with no name."""
    flags = os.O_RDWR | os.O_CLOEXEC
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            return os.open(directory, flags | tmpfile, 0o600)
        except OSError as exc:  # (a file system without it: a name, removed at once)
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    fd, name = tempfile.mkstemp(prefix="aioloader-spill-", dir=directory)
    os.unlink(name)
    return fd


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


class SpillWriter:
    """(In the worker) A fill job's writing of its chunk's region: `begin` with the chunk's
    record offsets and data size, then its data in order (`piece`), then `end`."""

    def __init__(self, job: Spill) -> None:
        self.job = job
        self.live = False
        self.refused = False
        self._fd: int | None = None
        self._at = self._pos = self._size = self._need = 0

    def begin(self, bounds: Any, size: int) -> None:
        bounds = np.ascontiguousarray(bounds, dtype=np.int64)
        n, job = len(bounds) - 1, self.job
        self._need = HEAD + 8 * len(bounds) + size
        if n != job.records or self._need > job.size or not len(bounds):
            return  # (not what the index said: this chunk is not spilled)
        self._fd = _open(job, os.O_WRONLY)
        if self._fd is None:  # (the loader closed it meanwhile)
            return
        self._size, self.live = size, True
        self._write(np.array([n, size], dtype=np.int64).tobytes() + bounds.tobytes(),
                    job.offset)
        self._at = job.offset + HEAD + 8 * len(bounds)

    def piece(self, data: Any) -> None:
        """The next bytes of the chunk's data (past the size it began with: not spilled,
        and nothing written past its region)."""
        if self.live and self._pos + len(data) > self._size:
            self.live = False
        if self.live:
            self._write(data, self._at + self._pos)
        self._pos += len(data)

    def whole(self, bounds: Any, values: Any) -> None:
        self.begin(bounds, len(values))
        self.piece(values)

    def end(self) -> int:
        """Bytes written (the whole region), 0 when not, or `SPILL_REFUSED`."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        if self.refused:
            return SPILL_REFUSED
        return self._need if self.live and self._pos == self._size else 0

    def _write(self, data: Any, at: int) -> None:
        view, fd = memoryview(data).cast("B"), self._fd
        assert fd is not None  # (live: open)
        try:
            while len(view):
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
        except OSError:
            self.live, self.refused = False, True


def read_into(job: Spill, wanted: np.ndarray, copy: Any) -> Any:
    """(In the worker) `copy(data, bounds, wanted)` over the region `job` reads, once its
    head and offsets check; None when they do not (or it cannot be read)."""
    fd = _open(job, os.O_RDONLY)
    if fd is None:
        return None
    try:
        mem = mmap.mmap(fd, job.size, access=mmap.ACCESS_READ, offset=job.offset)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    try:
        return _checked(mem, job, wanted, copy)
    finally:
        with contextlib.suppress(BufferError):  # (a view still held: it goes with it)
            mem.close()


def _open(job: Spill, flags: int) -> int | None:
    """The spill file of `job`, opened; None when it is gone (or its number is now
    another file's: the loader closed it)."""
    try:
        fd = os.open(job.path, flags | os.O_CLOEXEC | os.O_NONBLOCK)  # (never a FIFO's wait)
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != job.ident:
        os.close(fd)
        return None
    return fd


def _checked(mem: mmap.mmap, job: Spill, wanted: np.ndarray, copy: Any) -> Any:
    if len(mem) < HEAD:
        return None
    n, m = (int(v) for v in np.frombuffer(mem, np.int64, 2))
    if n != job.records or HEAD + 8 * (n + 1) + m != job.size or len(mem) != job.size:
        return None
    bounds = np.frombuffer(mem, np.int64, n + 1, HEAD).copy()
    if int(bounds[0]) < 0 or int(bounds[-1]) > m or bool((np.diff(bounds) < 0).any()):
        return None
    if len(wanted) and (int(wanted[0]) < 0 or int(wanted[-1]) >= n):
        return None
    with memoryview(mem) as view, view[HEAD + 8 * (n + 1):] as data:
        return copy(data, bounds, wanted)


def open_spill(directory: str | None, max_bytes: int | None, need: int
               ) -> tuple[SpillFile | None, str]:
    """The spill for chunks whose regions take `need` bytes, in `directory` (None: the
    default, `default_dir`), of at most `max_bytes` (None: `need`, all or nothing; 0: no
    spill), within what the disk has free with margin (`room`); and what to say of it."""
    if max_bytes == 0:
        return None, "off (spill_bytes=0)"
    where = directory or default_dir()
    if where is None:
        return None, "off: the temporary directory is held in memory (set spill_dir)"
    try:
        free = room(where)
    except OSError as exc:
        return None, f"off: {where} cannot hold it ({exc})"
    if max_bytes is None and need > free:
        return None, (f"off: it needs {need / 1e6:.0f} MB and {where} has room for "
                      f"{free / 1e6:.0f} MB (set spill_dir to a larger disk)")
    cap = min(need if max_bytes is None else max_bytes, need, free)
    try:
        spill = SpillFile(where, cap)
    except OSError as exc:
        return None, f"off: {where} cannot hold it ({exc})"
    if cap < need:
        return spill, (f"on for {cap / 1e6:.0f} of the {need / 1e6:.0f} MB it needs, in "
                       f"{where} (the chunks past it are decoded per horizon)")
    return spill, f"on ({need / 1e6:.0f} MB in {where}): each chunk is decoded once"


def room(directory: str) -> int:
    """What a spill may take of the disk of `directory`: at most half of its free space,
    and never its last 5%."""
    s = os.statvfs(directory)
    free, disk = s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize
    return max(0, min(free // 2, free - disk // 20))


def default_dir() -> str | None:
    """The system's temporary directory, or /var/tmp where that is held in memory; None
    when both are."""
    for where in (tempfile.gettempdir(), "/var/tmp"):
        if os.path.isdir(where) and os.access(where, os.W_OK) and not in_memory(where):
            return where
    return None
