"""The decoded-record spill of an exact shuffle over large chunks: each chunk's decoded records
written once to a local file by the fill job that first decodes it, so that its later fills
(the loader's later horizons and epochs, `runtime.horizons`) copy their wanted records out of
it instead of decoding the chunk again. An epoch then costs one decode of each chunk and a
copy of each record, however many horizons the decoded-chunk cache cuts it into; the disk
holds the chunks' decoded bytes for the loader's life.

`SpillFile` is the parent's: a file made already unlinked (`O_TMPFILE`, or a name removed at
once) in a directory of local disk, kept open, so nothing is left behind when the loader
closes, the process exits or is killed; the regions it reserved; and which of them a job
reported fully written (only those are ever read). Its bytes are taken on the disk when it
opens (`posix_fallocate`), so that a loader opened later sees them gone and a write never
meets a full disk halfway; a write refused all the same gives the unwritten tail back and
no more are tried. Workers of this host (processes, threads, the inline one) open it per
job through `/proc/<pid>/fd/<fd>`, and use what that opens only if it is the same file: its
(device, inode), no name, and the random nonce of its first bytes (once the loader closed
it, the number, and the inode too, may be another file's). A region is written with `pwrite`
(a full disk is an `OSError` the job reports, never a signal as a written map would give);
what is read back is checked (record count, lengths, ascending offsets within the region)
before a record is copied out, and a region that fails is decoded again.

The file: the nonce in its first `ALIGN` bytes, then the regions. A region: records n and
data bytes m (int64 each), the chunk's n + 1 record offsets (int64), then its m bytes of
records.
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

from ..mounts import in_memory
from .messages import SPILL_REFUSED, Spill

HEAD = 16  # records n, data bytes m
ALIGN = mmap.ALLOCATIONGRANULARITY  # regions start where a map may
NONCE = 16  # random bytes at offset 0 that say the file is this spill
SHARE = 4  # the default spill takes at most 1/SHARE of the disk's free space
KEEP = 10  # and leaves at least 1/KEEP of the disk free (so does a set spill_bytes)


def region_bytes(records: Any, decoded: Any) -> Any:
    """The bytes a region of a chunk of `records` records decoding to `decoded` bytes takes
    (aligned to where the next may start); elementwise over arrays."""
    need = HEAD + 8 * (np.asarray(records, dtype=np.int64) + 1) + \
        np.asarray(decoded, dtype=np.int64)
    return (need + ALIGN - 1) // ALIGN * ALIGN


class SpillFile:
    """The parent's side: the unlinked file (`path` opens it from any process of this
    host), with `max_bytes` of regions taken on the disk at once (an `OSError` when the disk
    cannot give them: no spill), reserved one per chunk key, and the figures for `stats()`
    (`written` bytes, `hits`: fills served, decodes avoided)."""

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
        self.nonce = os.urandom(NONCE)
        try:
            if not os.path.exists(self.path):  # (no /proc: workers could not open it)
                raise OSError(errno.ENOENT, "no /proc/<pid>/fd to share the spill file by")
            os.posix_fallocate(self._fd, 0, ALIGN + max_bytes)  # (ENOSPC: the disk is full)
            _write_all(self._fd, self.nonce, 0)
        except OSError:
            self.close()
            raise

    def job(self, key: Any, records: int, decoded: int) -> Spill | None:
        """The spill part of a fill job of chunk `key`: read its region when written, else
        write it if there is room (a region is reserved once); None: neither."""
        if self._fd is None:
            return None
        done = self._done.get(key)
        at = self._at.get(key)
        if done is not None and at is not None:
            return Spill(self.path, at[0], done, at[2], False, self.ident, self.nonce)
        if self.refused:
            return None
        if at is None:
            room = int(region_bytes(records, decoded))
            if self.reserved + room > self.max_bytes:
                return None
            at = self._at[key] = (ALIGN + self.reserved, room, int(records))
            self.reserved += room
        return Spill(self.path, at[0], at[1], at[2], True, self.ident, self.nonce)

    def outcome(self, key: Any, job: Spill, spilled: int) -> None:
        """What a job with `job` reported (`Result.spilled`)."""
        if job.write:
            if spilled > 0 and key in self._at:  # (not given back after a refusal)
                self._done[key] = spilled
                self.written += spilled
            elif spilled == SPILL_REFUSED:
                self.refused = True
            if self.refused:  # (a job still in flight may have written past what is kept)
                self._give_back()
        elif spilled < 0:  # read back wrong: never read again (the chunk is decoded)
            self._done.pop(key, None)
        else:
            self.hits += 1

    def _give_back(self) -> None:
        """After a refused write: the file cut to its last written region (the regions
        reserved but not written are forgotten), so that it takes no more than it holds."""
        self._at = {k: v for k, v in self._at.items() if k in self._done}
        end = max((v[0] + v[1] for v in self._at.values()), default=ALIGN)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)

    def figures(self) -> dict[str, int]:
        """`spill_bytes` written, `spill_hits`, and `spill_refused` (1) once the disk
        refused a write."""
        out = {"spill_bytes": self.written, "spill_hits": self.hits}
        if self.refused:
            out["spill_refused"] = 1
        return out

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


def _write_all(fd: int, data: Any, at: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


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
        self._fd = _open(job, os.O_RDWR)  # (read: its nonce)
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
        assert self._fd is not None  # (live: open)
        try:
            _write_all(self._fd, data, at)
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
    """The spill file of `job`, opened; None when it is gone or what its path opens is not
    it (the loader closed it: the number, and the inode too, may be another file's now):
    not of its (device, inode), or named, or without its nonce at offset 0."""
    try:
        fd = os.open(job.path, flags | os.O_CLOEXEC | os.O_NONBLOCK)  # (never a FIFO's wait)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        same = (st.st_dev, st.st_ino) == job.ident and st.st_nlink == 0 and \
            len(job.nonce) == NONCE and os.pread(fd, NONCE, 0) == job.nonce
    except OSError:
        same = False
    if not same:
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
    default, `default_dir`), of at most `max_bytes` (None: `need`, all or nothing, within a
    quarter of the disk's free space; 0: no spill), never past the disk's last tenth
    (`room`), taken on the disk as it opens (where it cannot be: off); and what to say of
    it."""
    if max_bytes == 0:
        return None, "off (spill_bytes=0)"
    where = directory or default_dir()
    if where is None:
        return None, "off: the temporary directory is held in memory (set spill_dir)"
    try:
        free = room(where, default=max_bytes is None)
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


def room(directory: str, default: bool = True) -> int:
    """What a spill may take of the disk of `directory`: never its last tenth (`KEEP`), and
    by `default` (no `spill_bytes` set) at most a quarter (`SHARE`) of its free space, so
    that loaders of one host (the ranks of a shard, each with its spill) together leave
    room: each takes its bytes as it opens, and the next sees them gone."""
    s = os.statvfs(directory)
    free, disk = s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize
    most = free - disk // KEEP - ALIGN
    return max(0, min(free // SHARE, most) if default else most)


def default_dir() -> str | None:
    """The system's temporary directory, or /var/tmp where that is held in memory; None
    when both are."""
    for where in (tempfile.gettempdir(), "/var/tmp"):
        if os.path.isdir(where) and os.access(where, os.W_OK) and not in_memory(where):
            return where
    return None
