"""The disk tier's store: segments of remote files as checked files in one local directory.

A segment is bytes `[start, end)` of one version of one object, keyed by
`SegmentKey(url, version, start, end)` (the version is the gs:// generation the file was
pinned to at open, so a rewritten object never reads as its old bytes). Several processes
on one host share a directory; everything here holds whatever they do at the same time:

- **Names**: an entry is `<hash of the key>.seg`. URLs (and so tokens or signed-URL query
  parameters) never appear in a file name, an entry, or a log line (those say `redact(url)`).
- **Entries are proved before use**: a 64-byte header (magic, a BLAKE2b digest of the key,
  start, length) and a 16-byte trailer (HighwayHash-64 of header and payload, an order of
  magnitude cheaper than BLAKE2b, and an end magic). A file that is truncated, of another
  key, damaged, or still being written (impossible under our own writes: they land by
  rename, but not under a foreign tool's) fails a check, is dropped, and is fetched again:
  it is never returned. The hash is a check, not a signature: hence a private directory.
- **Atomic writes**: a private temporary (O_EXCL|O_NOFOLLOW, 0600) renamed over the name.
  No fsync: a torn entry after a power cut fails its hash like any other damage.
- **One download per segment per host**: `try_lock`/`lock` take an `fcntl.flock` on
  `.<name>.lock`. The kernel drops a dead holder's lock, so nobody waits on a crashed
  process; the holder unlinks the lock file before releasing it, and a taker checks that
  the name still leads to the file it locked (the usual unlink-vs-flock race).
- **LRU within `max_bytes`, across processes** (`budget`): a use stamps the entry's mtime;
  a writer over the budget evicts the oldest entries not used in the last `GRACE_S` seconds;
  if that leaves no room, the new segment is simply not stored. The disk keeps a margin free.
- **The directory** is checked like the index cache's (aioloader.cache.index_cache): ours, not
  writable by group or others, else `PermissionError`; a path that is a file is refused with
  `NotADirectoryError`. Only names of our own patterns are ever removed: other files in a
  user's directory are left alone (and not counted).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import stat
from typing import Any, NamedTuple

from ..arrayrecord.hashing import highwayhash64
from ..urls import redact
from .budget import DiskBudget
from .entry import (
    END,
    HEADER,
    MAGIC,
    PAYLOAD_AT,
    TRAILER,
    EntryError,
    entry_size,
    proved,
)
from .privatedir import open_private_dir

log = logging.getLogger("aioloader")


class SegmentKey(NamedTuple):
    """Bytes `[start, end)` of `url` at `version` (its generation: files are pinned)."""

    url: str
    version: str
    start: int
    end: int

    def digest(self) -> bytes:
        text = f"aioloader-segment-1\0{self.url}\0{self.version}\0{self.start}\0{self.end}"
        return hashlib.blake2b(text.encode(), digest_size=32).digest()

    def describe(self) -> str:
        return f"bytes [{self.start}, {self.end}) of {redact(self.url)}"


class Lock:
    """A held per-entry download lock (see `DiskCache.try_lock`)."""

    def __init__(self, cache: DiskCache, name: str, fd: int) -> None:
        self._cache, self._name, self._fd = cache, name, fd

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):  # unlink first: a waiter then re-checks the name
            os.unlink(self._name, dir_fd=self._cache.dir_fd)
        os.close(self._fd)  # closing drops the flock
        self._fd = -1


class DiskCache:
    """Segments in the private directory `directory`, at most `max_bytes` of entries."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        if max_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
            raise NotADirectoryError(
                f"cache_dir {self.directory} exists and is not a directory: name a directory "
                "(it is created if missing) for the disk cache")
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        self.dir_fd = open_private_dir(self.directory, "cache_dir", "segments")
        self.hits = self.writes = self.dropped = 0
        self.budget = DiskBudget(self.directory, self.dir_fd, self.max_bytes)

    evicted = property(lambda self: self.budget.evicted, doc="Entries evicted for room.")
    refused = property(lambda self: self.budget.refused, doc="Entries not stored: no room.")

    def usage(self) -> int:
        """Bytes of entries (and temporaries) in the directory now: one scan."""
        return self.budget.usage()

    def make_room(self, n: int) -> bool:
        """Whether `n` more bytes fit, after evicting entries not used for GRACE_S."""
        return self.budget.make_room(n)

    # -- entries ------------------------------------------------------------------------

    @staticmethod
    def name(key: SegmentKey) -> str:
        return key.digest().hex()[:40] + ".seg"

    def path(self, key: SegmentKey) -> str:
        """The entry's path, for worker processes (the payload is at PAYLOAD_AT)."""
        return os.path.join(self.directory, self.name(key))

    def verify(self, key: SegmentKey) -> tuple[int, int] | None:
        """The entry's (st_dev, st_ino) once its every check passed (and its use stamped);
        None when missing, or bad: then it is dropped, with a warning."""
        name = self.name(key)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            why = "it is a symlink" if err.errno == errno.ELOOP else (err.strerror or str(err))
            self._drop(name, key, why, None)
            return None
        try:
            st = os.fstat(fd)
            try:
                _check(fd, st, key)
            except EntryError as err:
                self._drop(name, key, str(err), st)
                return None
            with contextlib.suppress(OSError):
                os.utime(fd)  # its use, for the LRU
            self.hits += 1
            return st.st_dev, st.st_ino
        finally:
            os.close(fd)

    def read(self, key: SegmentKey, known: tuple[int, int] | None,
             ranges: list[tuple[int, int]]) -> list[bytes] | None:
        """Bytes `[s, e)` (of the object) for each of `ranges`, from the entry: without a
        new check when it is still the file `known` (`verify`'s answer) proved, else after
        one. None when the entry is missing or bad."""
        opened = self._open_checked(key, known)
        if opened is None:
            return None
        fd, _, _ = opened
        try:
            at = PAYLOAD_AT - key.start
            out = [os.pread(fd, e - s, at + s) for s, e in ranges]
        finally:
            os.close(fd)
        if any(len(b) != e - s for b, (s, e) in zip(out, ranges)):
            return None
        return out

    def read_into(self, key: SegmentKey, known: tuple[int, int] | None,
                  dest: memoryview) -> tuple[int, int] | None:
        """The segment's bytes into `dest`, from the entry (checked whole unless it is still
        the file `known`); the entry's (st_dev, st_ino), or None when missing or bad."""
        n = key.end - key.start
        opened = self._open_checked(key, known)
        if opened is None:
            return None
        fd, ident, data = opened
        try:
            if data is not None:  # checked whole just now: copy what was read
                dest[:n] = memoryview(data)[PAYLOAD_AT : PAYLOAD_AT + n]
            elif os.preadv(fd, [dest[:n]], PAYLOAD_AT) != n:
                return None
        finally:
            os.close(fd)
        self.hits += 1
        return ident

    def _open_checked(self, key: SegmentKey, known: tuple[int, int] | None
                      ) -> tuple[int, tuple[int, int], Any] | None:
        """The entry open (the caller closes the descriptor), its (st_dev, st_ino), and its
        bytes when it was checked whole — it is not the file `known` proved — else None.
        None when it is missing or bad (a bad one is dropped, with a warning)."""
        name = self.name(key)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            ident = st.st_dev, st.st_ino
            return fd, ident, (_check(fd, st, key) if ident != known else None)
        except EntryError as err:
            os.close(fd)
            self._drop(name, key, str(err), st)
            return None
        except BaseException:
            os.close(fd)
            raise

    def write(self, key: SegmentKey, data: bytes | memoryview) -> bool:
        """Store `data` as `key`'s entry; False when there is no room for it (or the write
        failed: a warning). Replaces whatever entry had the name."""
        return self.store(key, data) is not None

    def store(self, key: SegmentKey, data: bytes | memoryview) -> tuple[int, int] | None:
        """`write`, answering the new entry's (st_dev, st_ino): proved as written, no need
        to read it back. None when not stored."""
        name = self.name(key)
        n = entry_size(len(data))
        if not self.budget.take(n):  # taken now: on disk after the rename, or given back
            return None
        header = HEADER.pack(MAGIC, key.digest(), key.start, len(data))
        digest = highwayhash64(header + bytes(data))
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=self.dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(header)
                    f.write(data)
                    f.write(TRAILER.pack(digest, END))
                    st = os.fstat(f.fileno())
                os.replace(tmp, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.dir_fd)
                raise
        except BaseException as err:
            self.budget.written(n, False)
            if not isinstance(err, OSError):
                raise
            log.warning("disk cache: %s not stored in %s: %s", key.describe(), self.directory,
                        err.strerror or err)
            return None
        self.budget.written(n, True)
        self.writes += 1
        return st.st_dev, st.st_ino

    # -- the download lock --------------------------------------------------------------

    def try_lock(self, key: SegmentKey) -> Lock | None:
        """The lock on downloading `key`, or None when another holds it now."""
        name = "." + self.name(key) + ".lock"
        while True:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.dir_fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            try:  # the holder before us may have unlinked it as we opened it: lock the new one
                same = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False).st_ino == \
                    os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return Lock(self, name, fd)
            os.close(fd)

    def _drop(self, name: str, key: SegmentKey, why: str, st: os.stat_result | None) -> None:
        """Warn, and remove the bad entry, unless the name already leads to another file (a
        fresh entry renamed over it meanwhile)."""
        self.dropped += 1
        log.warning("disk cache entry %s (%s) dropped: %s; fetching the segment again",
                    os.path.join(self.directory, name), key.describe(), why)
        try:
            now = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
            if st is None or (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(name, dir_fd=self.dir_fd)
        except OSError:
            pass

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = self.budget.dir_fd = -1


def _check(fd: int, st: os.stat_result, key: SegmentKey) -> bytes:
    """Every check an entry must pass (it reads the entry whole to hash it); the entry."""
    n = key.end - key.start
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise EntryError("it is not a plain file of ours")
    if st.st_size != entry_size(n):
        raise EntryError(f"it is {st.st_size} bytes, not {entry_size(n)} (truncated, or "
                         "not an entry of this segment)")
    digest, start, length, data = proved(fd, st)
    if digest != key.digest() or start != key.start or length != n:
        raise EntryError("it belongs to another segment, file or version")
    return data
