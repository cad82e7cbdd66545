"""The footer index cache on disk (`index_cache_dir`): one small entry per data file.

A cached index saves a file's tail read at open (on a bucket, a round trip per file). A wrong
index silently drops or invents records, so an entry is used only when it proves that it
belongs to this version of the file and is intact:

- bound to the file: its name and a key stored inside are a hash of (URL, size, version: the
  generation on gs://, mtime_ns locally), so a rewritten file misses;
- bound to its content: a BLAKE2b digest over the key and every value, arrays with their
  dtype and shape. This catches damage and edits; it is not a signature (whoever can write
  the directory can recompute it), which is why the directory must be private;
- sane: 1-D int64 arrays of one length, chunk offsets increasing inside the file, counts and
  sizes not negative, in an uncompressed archive no larger than its own file.

An entry that fails a check is ignored with a warning on the "aioloader" logger and rebuilt.

The directory must belong to us and be writable by no one else (sticky or not: another user
who can create names there can plant entries, and digests do not stop that). A directory that
fails this is refused with a `PermissionError` when the source is created, rather than
skipped with a warning: the user asked for the cache, and a quiet fallback would hide both
the risk and the lost speed. Entries are written to a randomly named temporary created
exclusively (O_EXCL|O_NOFOLLOW, mode 0600), then renamed over the entry; loading opens with
O_NOFOLLOW, so a symlink at an entry's name is never followed (a rebuild replaces it). Each
operation works relative to a descriptor of the directory, checked each time, so a path
swapped mid-run changes nothing. Failing to write an entry only costs speed: a warning.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import stat
import zipfile

import numpy as np

from .arrayrecord import FileIndex
from .storage import ObjectInfo, redact

log = logging.getLogger("aioloader")

_FORMAT = "aioloader-index-cache-2"
_ARRAYS = ("chunk_offsets", "chunk_records", "chunk_decoded_sizes")
_SUFFIX = ".v2.npz"  # entries of earlier versions (`<key>.npz`, no digest) are never read
_SLACK = 1 << 20  # an entry is at most this much larger than its data file


class CacheEntryError(ValueError):
    """Why an entry was not used (internal: it becomes a warning and a rebuild)."""


class IndexCache:
    """Footer indices of data files, kept in a private directory."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.close(self._open_dir())  # refuse an unsafe directory now, not at first use

    def load(self, info: ObjectInfo) -> FileIndex | None:
        """The cached index of `info`'s file, or None (missing, or failed a check: warned)."""
        key = _key(info)
        name = key[:32] + _SUFFIX
        try:
            dir_fd = self._open_dir()
        except PermissionError as err:
            log.warning("index cache not used: %s", err)
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            self._warn(name, "it is a symlink" if err.errno == errno.ELOOP else
                       f"it cannot be opened ({err.strerror})")
            return None
        finally:
            os.close(dir_fd)
        try:
            with os.fdopen(fd, "rb") as f:
                return _read(f, key, info)
        except Exception as err:  # whatever is wrong with it, it is only a miss
            self._warn(name, str(err) if isinstance(err, CacheEntryError) else
                       f"it cannot be read ({type(err).__name__}: {err})")
            return None

    def store(self, info: ObjectInfo, index: FileIndex) -> None:
        """Write `info`'s entry: a private temporary, renamed over the entry."""
        key = _key(info)
        name = key[:32] + _SUFFIX
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            dir_fd = self._open_dir()
        except PermissionError as err:
            log.warning("index cache not written: %s", err)
            return
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    _write(f, key, index)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
        except OSError as err:
            log.warning("index cache entry %s not written: %s", self._path(name), err)
        finally:
            os.close(dir_fd)

    # -- internals ----------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _warn(self, name: str, why: str) -> None:
        log.warning("index cache entry %s ignored: %s; rebuilding it from the file",
                    self._path(name), why)

    def _open_dir(self) -> int:
        """A descriptor of the directory, after checking that only we can write there."""
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        st = os.fstat(fd)
        problem = None
        if st.st_uid != os.geteuid():
            problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        elif st.st_mode & 0o022:
            who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others"))
                               if st.st_mode & bit)
            problem = (f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}); run "
                       f"`chmod go-w {self.directory}`")
        if problem:
            os.close(fd)
            raise PermissionError(
                f"index_cache_dir {self.directory} {problem}: another user could plant "
                "index entries that make files read wrong. Use a directory only you can "
                "write to (or pass no index_cache_dir)."
            )
        return fd


def _key(info: ObjectInfo) -> str:
    return hashlib.sha256(f"{info.url}\0{info.size}\0{info.version}".encode()).hexdigest()


def _digest(key: str, footer_offset: int, writer_options: str, arrays: dict) -> str:
    h = hashlib.blake2b(digest_size=32)
    h.update(json.dumps([_FORMAT, key, footer_offset, writer_options]).encode())
    for name in _ARRAYS:
        a = arrays[name]
        h.update(f"\0{name}:{a.dtype.str}:{a.shape}\0".encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def _write(f, key: str, index: FileIndex) -> None:
    arrays = {n: np.ascontiguousarray(getattr(index, n), dtype="<i8") for n in _ARRAYS}
    digest = _digest(key, int(index.footer_offset), index.writer_options, arrays)
    np.savez(f, key=np.array(key), footer_offset=np.array(index.footer_offset, dtype="<i8"),
             writer_options=np.array(index.writer_options), digest=np.array(digest), **arrays)


def _read(f, key: str, info: ObjectInfo) -> FileIndex:
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise CacheEntryError("it is not a plain file of ours")
    if st.st_size > info.size + _SLACK:
        raise CacheEntryError(f"it is larger ({st.st_size} bytes) than an index can be")
    with np.load(f, allow_pickle=False) as z:
        members = z.zip.infolist()
        if (any(m.compress_type != zipfile.ZIP_STORED for m in members)
                or sum(m.file_size for m in members) > st.st_size):
            raise CacheEntryError("it is not an uncompressed archive of its own size")
        values = {n: z[n] for n in ("key", "footer_offset", "writer_options", "digest",
                                    *_ARRAYS)}
    if str(values["key"]) != key:
        raise CacheEntryError("it belongs to another file or version")
    arrays = {n: values[n] for n in _ARRAYS}
    footer_offset = values["footer_offset"]
    if footer_offset.shape or footer_offset.dtype != np.dtype("<i8"):
        raise CacheEntryError("its footer offset is not one int64")
    footer_offset = int(footer_offset)
    writer_options = str(values["writer_options"])
    if str(values["digest"]) != _digest(key, footer_offset, writer_options, arrays):
        raise CacheEntryError("its checksum does not match its content (edited or damaged)")
    _check(arrays, footer_offset, info.size)
    return FileIndex(path=redact(info.url), size=info.size, footer_offset=footer_offset,
                     writer_options=writer_options, **arrays)


def _check(arrays: dict, footer_offset: int, size: int) -> None:
    """What any real index satisfies; a digest alone would pass a buggy writer's entry."""
    offsets, counts, decoded = (arrays[n] for n in _ARRAYS)
    if any(a.dtype != np.dtype("<i8") or a.ndim != 1 or len(a) != len(offsets)
           for a in arrays.values()):
        raise CacheEntryError("its arrays are not 1-D int64 of one length")
    if not 0 < footer_offset < size:
        raise CacheEntryError(f"its footer offset {footer_offset} is outside the file")
    if len(offsets) and (offsets[0] < 64 or offsets[-1] >= footer_offset
                         or (np.diff(offsets) <= 0).any()):
        raise CacheEntryError("its chunk offsets are not increasing within the file")
    if (counts < 0).any() or (decoded < 0).any() or counts.sum(dtype=np.float64) >= 2**62:
        raise CacheEntryError("its record counts or decoded sizes are out of range")
