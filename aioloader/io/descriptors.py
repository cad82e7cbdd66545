"""Descriptors of local data files, kept open up to a cap: one LRU per process (`shared()`).

Reading a record from a local file is one `pread` on a descriptor kept open, but a dataset
may have more files than the process may hold descriptors (`ulimit -n` is often 1,024; so
are shard counts). Every reader of local data files in a process (the storage backend of
the parent, the decoder of a worker or of `workers=0`) takes its descriptors from one
least-recently-used set, capped from `RLIMIT_NOFILE` with headroom for the sockets, pipes
and memory files the rest of the loader and the program need (`cap_for`).

- A descriptor is lent (`FileSet.hold`) for the duration of a read, and one lent is never
  closed: eviction takes the least recently used of those not lent. When every kept one is
  lent, another is opened anyway and closed when given back, so the cap bounds what is kept,
  and a caller bounds what it holds at once (`FileSet.limit`, a fraction of the cap).
- Each reader (`FileSet`) pins a path to the file (device, inode) it first opened there. A
  path reopened after its descriptor was evicted, that names another file now (replaced by
  a rename, `rsync`, `cp`), raises `ObjectChangedError`: records are never read half from
  one file and half from another. A kept descriptor that a new reader meets is checked
  against the path first (one `stat`), so a process that re-opens a rebuilt dataset reads
  the new files.
- A read may be asked to take the page cache's bytes only (`FileSet.pread_cached`): it then
  never waits for a disk, so many of them can run one after another on one thread, where
  reads that may wait are spread over several.
- Running out of descriptors anyway (the program holds many others) drops every kept one
  not lent, lowers the cap, and tries again; if that fails too, the error says the limit
  and what to do (`too_many_open`).

Worker processes each have their own set, sized from their own limit; a forked child
closes the descriptors it inherited and starts empty.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from ..errors import ObjectChangedError

log = logging.getLogger("aioloader")

MIN_CAP = 8
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
# whether a read can be asked to take only what the page cache holds (Linux 4.14+; `preadv`
# with RWF_NOWAIT): cleared if the kernel lacks it; a file system that refuses it (tmpfs,
# some network ones) goes in NO_CACHED_READS, by device, and its files are read as before
CACHED_READS = bool(_NOWAIT) and hasattr(os, "preadv")
NO_CACHED_READS: set[int] = set()


def cap_for(soft_limit: int) -> int:
    """Data-file descriptors kept under a soft `RLIMIT_NOFILE` of `soft_limit`: all but an
    eighth of it, and at least 32 left for everything else (at 1,024: 896; at 64: 32)."""
    soft = min(soft_limit, 1 << 20) if soft_limit != resource.RLIM_INFINITY else 1 << 20
    return max(MIN_CAP, soft - max(32, soft // 8))


def soft_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def too_many_open(err: OSError, doing: str) -> OSError:
    """`err` (EMFILE/ENFILE) as an error that says the limit and what to do."""
    limit = soft_limit()
    shown = "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
    return OSError(err.errno, f"too many open files while {doing}: this process may hold "
                   f"{shown} descriptors (RLIMIT_NOFILE, `ulimit -n`) and its data files "
                   f"keep at most {shared().cap} of them; raise the limit (`ulimit -n 65536` "
                   "before starting Python, or resource.setrlimit(resource.RLIMIT_NOFILE, "
                   "...) before importing aioloader), or close other files, loaders or "
                   "sockets this program keeps open")


class _Kept:
    __slots__ = ("fd", "ident", "lent")

    def __init__(self, fd: int, ident: tuple[int, int]) -> None:
        self.fd, self.ident, self.lent = fd, ident, 0


class Descriptors:
    """Open descriptors by path, least recently used first; safe across threads."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._extra = 0  # descriptors lent beyond the cap (closed when given back)
        self.opened = 0  # opens, for tests and stats

    def __len__(self) -> int:
        return len(self._kept) + self._extra

    def lend(self, path: str, pins: dict[str, tuple[int, int]]) -> int:
        """A descriptor of `path`, as `pins` has it (pinned on first use); give it back
        with `give_back(path, fd)`."""
        with self._lock:
            kept = self._kept.get(path)
            if kept is not None and pins.get(path) == kept.ident:
                kept.lent += 1
                self._kept.move_to_end(path)
                return kept.fd
        return self._lend_slow(path, pins)

    def _lend_slow(self, path: str, pins: dict[str, tuple[int, int]]) -> int:
        pinned = pins.get(path)
        with self._lock:
            kept = self._kept.get(path)
        if kept is not None and pinned is None:  # a descriptor another reader opened
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise _gone(path) from None
            if (st.st_dev, st.st_ino) == kept.ident:
                pins[path] = kept.ident
                return self.lend(path, pins)
        fd = self._open(path)
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            pinned = pins.setdefault(path, ident)  # (another thread may have pinned it)
            if ident != pinned:
                raise ObjectChangedError(
                    f"{path} was replaced by another file while it was being read (its "
                    f"device and inode were {pinned}, now {ident}): re-open the dataset")
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            kept = self._kept.get(path)
            if kept is not None and kept.ident == ident:  # opened meanwhile: use that one
                kept.lent += 1
                self._kept.move_to_end(path)
                spare, fd = fd, kept.fd
            elif kept is not None and kept.lent:  # an older file here, still being read
                self._extra += 1
                return fd
            else:
                spare = kept.fd if kept is not None else -1
                self._kept[path] = entry = _Kept(fd, ident)
                self._kept.move_to_end(path)  # (a replaced entry keeps its place otherwise)
                entry.lent = 1
                self._trim()
        if spare >= 0:
            os.close(spare)
        return fd

    def give_back(self, path: str, fd: int) -> None:
        with self._lock:
            kept = self._kept.get(path)
            if kept is not None and kept.fd == fd:
                kept.lent -= 1
                if len(self._kept) > self.cap:
                    self._trim()
                return
            self._extra -= 1
        os.close(fd)  # lent beyond the cap

    def _trim(self) -> None:
        """Close the least recently used descriptors not lent, down to the cap (locked)."""
        over = len(self._kept) - self.cap
        if over <= 0:
            return
        idle = []
        for path, kept in self._kept.items():  # oldest first
            if not kept.lent:
                idle.append(path)
                if len(idle) == over:
                    break
        for path in idle:
            os.close(self._kept.pop(path).fd)

    def _open(self, path: str) -> int:
        try:
            fd = os.open(path, _FLAGS)
        except FileNotFoundError:
            raise _gone(path) from None
        except OSError as err:
            if err.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            with self._lock:
                had = len(self._kept)
                idle = [p for p, k in self._kept.items() if not k.lent]
                for p in idle:
                    os.close(self._kept.pop(p).fd)
                self.cap = max(MIN_CAP, min(self.cap, had // 2))
            log.warning("out of file descriptors with %d data files open: %d closed, and "
                        "at most %d kept from now on", had, len(idle), self.cap)
            try:
                fd = os.open(path, _FLAGS)
            except OSError as again:
                if again.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                raise too_many_open(again, f"opening {path}") from None
        self.opened += 1
        return fd

    def forget(self, paths: Sequence[str]) -> None:
        """Close the kept descriptors of `paths` that are not lent (a reader closed)."""
        with self._lock:
            for path in paths:
                kept = self._kept.get(path)
                if kept is not None and not kept.lent:
                    del self._kept[path]
                    os.close(kept.fd)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        for kept in self._kept.values():
            with contextlib.suppress(OSError):
                os.close(kept.fd)
        self._kept.clear()
        self._extra = 0


def _gone(path: str) -> ObjectChangedError:
    return ObjectChangedError(f"{path} was deleted after it was opened: re-open the dataset")


_shared: Descriptors | None = None
_shared_lock = threading.Lock()


def shared() -> Descriptors:
    """This process's descriptors of data files (made on first use, capped from its limit)."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = Descriptors(cap_for(soft_limit()))
    return _shared


def _reset_in_child() -> None:
    if _shared is not None:
        _shared._after_fork()


os.register_at_fork(after_in_child=_reset_in_child)


class FileSet:
    """One reader's view of the shared descriptors: the files it pinned, and how many it
    may hold at once (`limit`: a quarter of the cap, so that a few readers of one process
    holding their most at once stay within it)."""

    def __init__(self, descriptors: Descriptors | None = None,
                 pins: dict[str, tuple[int, int]] | None = None) -> None:
        """`pins`: files already pinned (path -> device and inode), e.g. those a dataset
        opened, so that this reader reads them or refuses, never another file there now."""
        self._fds = descriptors if descriptors is not None else shared()
        self._pins: dict[str, tuple[int, int]] = dict(pins or {})

    @property
    def limit(self) -> int:
        return max(1, self._fds.cap // 4)

    @property
    def opened(self) -> int:
        return self._fds.opened

    def hold(self, paths: Sequence[str]) -> list[int]:
        """Descriptors of `paths` (at most `limit` of them), lent until `let_go`."""
        out: list[int] = []
        try:
            for path in paths:
                out.append(self._fds.lend(path, self._pins))
        except BaseException:
            self.let_go(paths[: len(out)], out)
            raise
        return out

    def let_go(self, paths: Sequence[str], fds: Sequence[int]) -> None:
        for path, fd in zip(paths, fds):
            self._fds.give_back(path, fd)

    @contextlib.contextmanager
    def held(self, paths: Sequence[str]) -> Iterator[list[int]]:
        fds = self.hold(paths)
        try:
            yield fds
        finally:
            self.let_go(paths, fds)

    def pread(self, path: str, n: int, offset: int) -> bytes:
        fds = self._fds
        fd = fds.lend(path, self._pins)
        try:
            return os.pread(fd, n, offset)
        finally:
            fds.give_back(path, fd)

    def pread_cached(self, path: str, n: int, offset: int) -> bytes | None:
        """`pread`, or None when the page cache does not hold all of it: a read that would
        wait for a disk or a network file system (`RWF_NOWAIT`), or one this system (then
        None for every later call too: `CACHED_READS`) or this file's file system (then
        for its device's files: `NO_CACHED_READS`) cannot ask so, or any other failure
        (the read as before then says what it is)."""
        global CACHED_READS
        if not CACHED_READS:
            return None
        fds = self._fds
        fd = fds.lend(path, self._pins)
        try:
            device = self._pins[path][0]
            if device in NO_CACHED_READS:
                return None
            buf = bytearray(n)
            got = os.preadv(fd, [buf], offset, _NOWAIT)
        except BlockingIOError:
            return None
        except OSError as err:
            if err.errno == errno.ENOSYS:  # (the kernel: no file takes it)
                CACHED_READS = False
            elif err.errno == errno.EOPNOTSUPP:  # (this file system)
                NO_CACHED_READS.add(device)
            return None
        finally:
            fds.give_back(path, fd)
        return bytes(buf) if got == n else None  # (short: a part not cached, or the end)

    def close(self) -> None:
        """Close the descriptors this reader used that no one is reading from."""
        self._fds.forget(list(self._pins))
        self._pins.clear()


def spans(files: Sequence[int], count: int, limit: int) -> list[tuple[int, int]]:
    """Consecutive ranges `[lo, hi)` of `files` (each read's file, of `count` distinct
    ones) that each name at most `limit` distinct files: one range when all fit."""
    if count <= limit:
        return [(0, len(files))]
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    lo = 0
    for i, f in enumerate(files):
        if f not in seen:
            if len(seen) == limit:
                out.append((lo, i))
                seen, lo = set(), i
            seen.add(f)
    out.append((lo, len(files)))
    return out
