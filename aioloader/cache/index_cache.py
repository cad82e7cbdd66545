"""The footer index cache on disk (`index_cache_dir`): one mapped table per set of files.

A cached index saves every file's tail read and footer parse at open (on a bucket, a round
trip per file). An entry holds the whole table of a source's files, in one flat file that
is memory-mapped, not read: the `RecordTable` of every process that opens the same files on
this host is a view of the same page-cache pages (about 12 bytes per group_size-1 record:
chunk offsets with each file's footer offset after its own, uint32 decoded sizes where they
fit, record counts only for files whose chunks hold more than one), so N processes cost one
copy, and a 5M-record open maps 60 MB instead of parsing footers.

Layout: 8-byte magic, 8-byte little-endian header length, a JSON header (format, key,
digest, per file: footer offset, chunk count, whether counts are stored; array dtypes and
places), then the arrays, each 64-byte aligned. A wrong index silently drops or invents
records, so an entry is used only when it proves that it belongs to these versions of these
files and is intact:

- bound to the files: its name is a hash of the files' URLs, and a key stored inside a hash of
  every file's (URL, size, version: the generation on gs://; locally mtime_ns, ctime_ns,
  device and inode, `backends.local_version`) in order. A rewritten, added or removed file
  misses: the stale entry is dropped and the table rebuilt under the same name;
- bound to each file's footer, wherever a version alone does not prove the content: on
  every store but gs:// (whose generation is new for every write of an object). Locally
  `rsync -a` or `cp -p` restores an mtime, and a rewrite within one clock tick keeps it;
  other stores' versions are an mtime (seconds, on some) or an ETag that web servers make
  from the mtime and size, and small ArrayRecord files, padded to 64 KiB blocks, are often
  rewritten at the same size. The first `HEAD_BYTES` bytes at each such file's footer
  offset (the footer chunk's header, with the hash of the footer that every chunk offset
  comes from) are stored, and compared with the file's before the entry is used
  (`opening`); a mismatch drops it;
- bound to its content: a BLAKE2b digest over the header's fields and every array's bytes.
  This catches damage and edits; it is not a signature (whoever can write the directory can
  recompute it), which is why the directory must be private;
- sane: what any real index satisfies, checked vectorized over the table: per file, chunk
  offsets increasing from the first its format allows (ArrayRecord: byte 64) to below the
  footer, footer inside the file (as its format bounds it: `RecordFormat.index_limits`),
  record counts at least 1 and at most the chunk's bytes; arrays inside the entry; an
  entry no larger than its files.

Files of any record format go in (`aioloader.formats`): a TFRecord file's index is the scan of
its length headers, ending at its size rather than at a footer; its "footer head" is the
last HEAD_BYTES bytes of the file (`RecordFormat.proof_offset`). A file's format is part of
the entry's name and key (ArrayRecord's adds nothing, so its entries keep their names) and is
stored beside it. A format that reads some columns (Parquet) is named with them
(`formats.reading`), so an entry for one selection never serves another; a contextual
format's per-file contexts (a Parquet footer) are stored in the entry too.

An entry that fails a check is ignored with a warning on the "aioloader" logger and rebuilt.
A record read through a cached table that fails as corrupt drops the entry too, and the
file's footer is read again before the error is reported (`source.api`): a rewrite no check
caught is reported as such, and the next open rebuilds the table.

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
import mmap
import os
import re
import secrets
import stat
import time
from collections.abc import Sequence

import numpy as np

from .. import formats as fmts
from ..arrayrecord import FileIndex
from ..io.storage import ObjectInfo, is_local
from ..urls import is_gcs
from .entrytable import HEAD_BYTES as HEAD_BYTES  # (the index cache's, to its users)
from .entrytable import CachedTable, CacheEntryError
from .entrytable import indices as _indices
from .privatedir import open_private_dir

log = logging.getLogger("aioloader")

_FORMAT = "aioloader-index-table-5"  # 5: footer heads; named by the files' URLs alone
_MAGIC = b"AIOLIDX5"
_SUFFIX = ".v5.idx"  # entries of earlier versions (`.npz`, `.v3.idx`, ...) are never read
_SLACK = 1 << 20  # an entry is at most this much larger than its data files
_ALIGN = 64
_MAX_HEADER = 1 << 30
_TMP = re.compile(r"\.[0-9a-f]{32}" + re.escape(_SUFFIX) + r"\.[0-9a-f]{16}\.tmp")  # (`store`)
_STALE_TMP_NS = 3600 * 10**9  # a temporary this old is a killed writer's (`_bound`)


def checked(info: ObjectInfo) -> bool:
    """Whether a file's footer head is checked: its version does not prove its content
    (any file but a gs:// object with its generation)."""
    return is_local(info.url) or not (info.version and is_gcs(info.url))


class StaleEntry(CacheEntryError):
    """The entry of these files, for other versions of them (dropped, then rebuilt)."""


class IndexCache:
    """Footer indices of data files, kept in a private directory."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int | None = None) -> None:
        """`max_bytes`: the most its entries may take in all, the least recently used
        removed first after a write (None: no bound, for a directory the user named)."""
        self.directory = os.fspath(directory)
        self.max_bytes = max_bytes
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.close(self._open_dir())  # refuse an unsafe directory now, not at first use

    def load(self, infos: Sequence[ObjectInfo],
             kinds: Sequence[str] | None = None) -> CachedTable | None:
        """The cached table of these files (of formats `kinds`, default all ArrayRecord),
        or None (missing, or failed a check: warned)."""
        key, name = _key(infos, kinds), _name(infos, kinds)
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
            table = _read(fd, key, infos, kinds)
            if self.max_bytes is not None:  # used now: the last to go (`_bound`)
                with contextlib.suppress(OSError):
                    os.utime(fd)
            return table
        except StaleEntry as err:
            self.drop(infos, str(err), kinds)
            return None
        except Exception as err:  # whatever is wrong with it, it is only a miss
            self._warn(name, str(err) if isinstance(err, CacheEntryError) else
                       f"it cannot be read ({type(err).__name__}: {err})")
            return None
        finally:
            os.close(fd)

    def drop(self, infos: Sequence[ObjectInfo], why: str,
             kinds: Sequence[str] | None = None) -> None:
        """Remove the entry of these files (stale: `why`); the next open rebuilds it."""
        name = _name(infos, kinds)
        try:
            dir_fd = self._open_dir()
        except PermissionError:
            return
        try:
            os.unlink(name, dir_fd=dir_fd)
            log.info("index cache entry %s dropped: %s", self._path(name), why)
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("index cache entry %s not dropped (%s): %s", self._path(name), why, err)
        finally:
            os.close(dir_fd)

    def store(self, infos: Sequence[ObjectInfo], indices: Sequence[FileIndex],
              heads: np.ndarray, kinds: Sequence[str] | None = None) -> None:
        """Write the files' table and footer heads (`heads[k]`: file k's first HEAD_BYTES
        bytes at its format's proof offset, where `checked`): a private temporary, renamed
        over the entry."""
        key, name = _key(infos, kinds), _name(infos, kinds)
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
                    _write(f, key, name, indices, heads, kinds)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
            if self.max_bytes is not None:
                self._bound(dir_fd, name)
        except OSError as err:
            log.warning("index cache entry %s not written: %s", self._path(name), err)
        finally:
            os.close(dir_fd)

    def _bound(self, dir_fd: int, new: str) -> None:
        """Remove the least recently used entries (by mtime: written or loaded) until the
        entries take at most `max_bytes`; the one just written goes only if it alone is
        larger. Another process may remove the same ones meanwhile."""
        assert self.max_bytes is not None
        entries = []
        stale = time.time_ns() - _STALE_TMP_NS
        with os.scandir(dir_fd) as found:
            for e in found:
                if not e.is_file(follow_symlinks=False):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat(follow_symlinks=False)
                    if e.name.endswith(_SUFFIX):
                        entries.append((e.name == new, st.st_mtime_ns, e.name, st.st_size))
                    elif _TMP.fullmatch(e.name) and st.st_mtime_ns < stale:
                        os.unlink(e.name, dir_fd=dir_fd)  # (a writer killed mid-write)
        total = sum(size for *_, size in entries)
        if any(is_new and size > self.max_bytes for is_new, _, _, size in entries):
            entries = [x for x in entries if x[0]]  # too large alone: only it goes
        for _, _, name, size in sorted(entries):  # (the new one last)
            if total <= self.max_bytes:
                break
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError as err:
                log.debug("index cache entry %s not removed: %s", self._path(name), err)
                continue
            total -= size
            log.debug("index cache entry %s removed: the cache keeps at most %d bytes",
                      self._path(name), self.max_bytes)

    # -- internals ----------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _warn(self, name: str, why: str) -> None:
        log.warning("index cache entry %s ignored: %s; rebuilding it from the file",
                    self._path(name), why)

    def _open_dir(self) -> int:
        return open_private_dir(self.directory, "index_cache_dir", "index entries")


def _kinds(infos: Sequence[ObjectInfo], kinds: Sequence[str] | None) -> list[str]:
    """Each file's record format (default ArrayRecord)."""
    if kinds is None:
        return [fmts.ARRAYRECORD] * len(infos)
    if len(kinds) != len(infos):
        raise ValueError("one record format per file")
    return list(kinds)


def _tag(kind: str) -> str:
    """What a file's format adds to the name and key (ArrayRecord: nothing)."""
    return "" if kind == fmts.ARRAYRECORD else f"\0format={kind}"


def _name(infos: Sequence[ObjectInfo], kinds: Sequence[str] | None = None) -> str:
    """An entry's name: a hash of the files' URLs (and formats), so a new version replaces
    the old."""
    h = hashlib.sha256(_FORMAT.encode())
    for info, kind in zip(infos, _kinds(infos, kinds)):
        h.update(f"\0{info.url}{_tag(kind)}".encode())
    return h.hexdigest()[:32] + _SUFFIX


def _key(infos: Sequence[ObjectInfo], kinds: Sequence[str] | None = None) -> str:
    h = hashlib.sha256(_FORMAT.encode())
    for info, kind in zip(infos, _kinds(infos, kinds)):
        h.update(f"\0{info.url}\0{info.size}\0{info.version}{_tag(kind)}".encode())
    return h.hexdigest()


def _digest(key: str, files: list, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=32)
    h.update(json.dumps([_FORMAT, key, files]).encode())
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"\0{name}:{a.dtype.str}:{a.shape}\0".encode())
        h.update(a.data)
    return h.hexdigest()


def _write(f, key: str, entry_name: str, indices: Sequence[FileIndex], heads: np.ndarray,
           kinds: Sequence[str] | None = None) -> None:
    # per file: footer offset, chunks, counts stored?, options, spec[, format unless ArrayRecord]
    # [, context's length: a contextual format's (`FileIndex.context`, in "contexts")]
    files = [[int(ix.footer_offset), int(ix.num_chunks), not ix.one_record_chunks,
              ix.writer_options, ix.element_spec,
              *([kind] if _tag(kind) or ix.context else []),
              *([len(ix.context)] if ix.context else [])]
             for ix, kind in zip(indices, kinds or [fmts.ARRAYRECORD] * len(indices))]
    bounds = np.empty(sum(ix.num_chunks + 1 for ix in indices), dtype="<i8")
    at = 0
    for ix in indices:
        bounds[at : at + ix.num_chunks] = ix.chunk_offsets
        bounds[at + ix.num_chunks] = ix.footer_offset
        at += ix.num_chunks + 1
    sizes = [ix.chunk_decoded_sizes for ix in indices]
    narrow = all(len(d) == 0 or (d.min() >= 0 and d.max() < 1 << 32) for d in sizes)
    decoded = (np.concatenate(sizes) if sizes else np.zeros(0)).astype(
        "<u4" if narrow else "<i8")
    counts = [ix.chunk_records for ix in indices if not ix.one_record_chunks]
    arrays = {"bounds": bounds, "decoded": decoded,
              "counts": (np.concatenate(counts) if counts else np.zeros(0)).astype("<i8"),
              "heads": np.ascontiguousarray(heads, dtype=np.uint8).reshape(-1)}
    if any(ix.context for ix in indices):  # (none: an entry as earlier versions wrote)
        arrays["contexts"] = np.frombuffer(b"".join(ix.context for ix in indices),
                                           dtype=np.uint8)
    digest = _digest(key, files, arrays)
    places, at = {}, 0
    for name, a in arrays.items():
        places[name] = [a.dtype.str, at, len(a)]
        at += -(-a.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"format": _FORMAT, "name": entry_name, "key": key, "digest": digest,
                         "files": files, "arrays": places}).encode()
    head = len(_MAGIC) + 8 + len(header)
    pad = -head % _ALIGN
    f.write(_MAGIC + (len(header) + pad).to_bytes(8, "little") + header + b" " * pad)
    for a in arrays.values():
        f.write(a.data)
        f.write(b"\0" * (-a.nbytes % _ALIGN))


def _read(fd: int, key: str, infos: Sequence[ObjectInfo],
          kinds: Sequence[str] | None = None) -> CachedTable:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise CacheEntryError("it is not a plain file of ours")
    if st.st_size > sum(i.size for i in infos) + _SLACK:
        raise CacheEntryError(f"it is larger ({st.st_size} bytes) than an index can be")
    head = os.pread(fd, 16, 0)
    if len(head) != 16 or head[:8] != _MAGIC:
        raise CacheEntryError("it is not an index table of this version")
    n = int.from_bytes(head[8:], "little")
    if n > min(_MAX_HEADER, st.st_size - 16):
        raise CacheEntryError("its header runs past its end")
    header = json.loads(os.pread(fd, n, 16))
    if header.get("name") != _name(infos, kinds):
        raise CacheEntryError("it belongs to other files")
    if header.get("key") != key:
        raise StaleEntry("the files changed since it was written (size or version)")
    files, places = header["files"], header["arrays"]
    if len(files) != len(infos):
        raise CacheEntryError("it holds another number of files")
    body = 16 + n
    mm = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) if st.st_size else b""
    arrays = {}
    for name, dtypes in (("bounds", ("<i8",)), ("decoded", ("<u4", "<i8")), ("counts", ("<i8",)),
                         ("heads", ("|u1",)), ("contexts", ("|u1",))):
        if name == "contexts" and name not in places:  # (an entry without contexts)
            continue
        dtype, at, length = places[name]
        if dtype not in dtypes or not (isinstance(at, int) and isinstance(length, int)) \
                or at < 0 or length < 0 or body + at + length * np.dtype(dtype).itemsize > \
                st.st_size:
            raise CacheEntryError(f"its {name} array lies outside it")
        arrays[name] = np.frombuffer(mm, dtype=dtype, count=length, offset=body + at)
    if header.get("digest") != _digest(key, files, arrays):
        raise CacheEntryError("its checksum does not match its content (edited or damaged)")
    return _indices(files, arrays, infos, _kinds(infos, kinds))
