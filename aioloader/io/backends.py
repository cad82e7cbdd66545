"""Stores: the `Backend` protocol `storage.Storage` reads through, and the stores that are not
gs://: local files and any other fsspec filesystem (gs:// is `gcs_client`'s).

- local paths: `os.pread` on a descriptor kept open (at most as many as the process's limit
  allows: `descriptors`), in a thread pool we size ourselves, with batched preads (one
  thread hop for many page-cache reads), and a listing in one job;
- any other fsspec filesystem: its async `_cat_file` when it has one, else threads.

A backend makes one attempt and classifies failure: `Transient` (worth retrying) or a final
error. Limits, retries and stats are `storage.Storage`'s job, silence and hedging `retry`'s: a
backend whose `streams` is true takes a `watch` and tells it when the response head and each
body chunk arrive (it sets no timeouts of its own); the others answer whole.
"""

from __future__ import annotations

import asyncio
import glob as globlib
import os
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import MissingExtraError, StorageError, Transient
from ..urls import STORAGE_LOGGERS, redact, redact_logs
from .descriptors import FileSet

if TYPE_CHECKING:
    from .hedge import Watch

__all__ = ["Backend", "FsspecBackend", "LocalBackend", "ObjectInfo", "StreamingBackend",
           "Tail", "close_session", "file_info", "listed_files", "local_ident", "local_version"]


class ObjectInfo(NamedTuple):
    """What opening a file needs: its size, and a version that changes when it is rewritten."""

    url: str
    size: int
    version: str


class Tail(NamedTuple):
    """An object's size and version with its last `len(data)` bytes, from one request."""

    info: ObjectInfo
    data: bytes


class Backend(Protocol):
    """One kind of store, as `storage.Storage` calls it: one attempt per call, `Transient`
    for a failure worth retrying, any other error final. `streams`: reads take a `watch`
    (`StreamingBackend`)."""

    streams: bool

    async def info(self, path: str) -> ObjectInfo: ...
    async def glob(self, pattern: str) -> list[ObjectInfo]: ...
    async def read(self, path: str, start: int, end: int) -> bytes: ...
    async def aclose(self) -> None: ...


class StreamingBackend(Backend, Protocol):
    """A store whose reads tell a `hedge.Watch` what they receive (gs:// on libcurl), write
    straight into a buffer, and open an object by its tail in one request."""

    async def read(self, path: str, start: int, end: int,
                   watch: Watch | None = None) -> bytes: ...
    async def read_into(self, path: str, start: int, end: int, dest: memoryview,
                        watch: Watch | None = None) -> None: ...
    async def read_tail(self, path: str, n: int, watch: Watch | None = None) -> Tail | None: ...
    async def prepare(self) -> None: ...


class LocalBackend:
    """Local files: a listing is one thread-pool job (glob, then one `stat` per match, for
    both "is it a file" and its size and version); reads are `os.pread` on descriptors kept
    open (`descriptors`: the process's capped set), opened inside the thread-pool job that
    first reads them (an `open` is time the event loop need not spend: a cold open of
    many shards opens each file)."""

    streams = False

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="aioloader-pread")
        self._files = FileSet()

    async def info(self, path: str) -> ObjectInfo:
        st = await asyncio.get_running_loop().run_in_executor(self._pool, os.stat, path)
        if stat.S_ISDIR(st.st_mode):  # else "4096 bytes is too small for an ArrayRecord file"
            raise IsADirectoryError(f"{path}: is a directory (name files, or a glob such as "
                                    f"'{os.path.join(path, '*.array_record')}')")
        return ObjectInfo(path, st.st_size, local_version(st))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, _list_files,
                                                                pattern)

    async def read(self, path: str, start: int, end: int) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, self._files.pread, path, end - start, start)

    async def read_batch(self, items: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Several preads in one thread-pool job: one hop instead of one per range."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, _pread_all,
                                                                self._files, items)

    async def read_cached(self, items: Sequence[tuple[str, int, int]]) -> list[bytes | None]:
        """The reads the page cache holds whole, in one thread-pool job (None for the
        others, which may wait for a disk: `FileSet.pread_cached`). Each such read is a
        copy of a few microseconds; spread over threads they would only contend."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, _pread_cached,
                                                                self._files, items)

    async def aclose(self) -> None:
        self._pool.shutdown(wait=True)  # first: no job is reading any more
        self._files.close()


def local_version(st: os.stat_result) -> str:
    """A local file's version: what a rewrite changes. mtime alone is not enough (`cp -p`
    and `rsync -a` restore it); ctime cannot be set back, and a file replaced by a rename
    has another inode. (A chmod changes ctime too: a needless miss, not a wrong read.)"""
    return f"{st.st_mtime_ns}.{st.st_ctime_ns}.{st.st_dev}.{st.st_ino}"


def local_ident(version: str) -> tuple[int, int] | None:
    """The device and inode of a local file's `local_version` (None: not such a version)."""
    parts = version.split(".")
    if len(parts) != 4 or not all(p.isdigit() for p in parts[2:]):
        return None
    return int(parts[2]), int(parts[3])


def _list_files(pattern: str) -> list[ObjectInfo]:
    """The regular files (symlinks followed) `pattern` matches, sorted, with sizes and
    versions; one that vanishes between the listing and its `stat` is left out."""
    out = []
    for path in sorted(globlib.glob(pattern, recursive=True)):
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(ObjectInfo(path, st.st_size, local_version(st)))
    return out


def _pread_all(files: FileSet, items: Sequence[tuple[str, int, int]]) -> list[bytes]:
    """The reads `items`, each file's descriptor held once for all (a few, at most
    `files.limit`; else one at a time, each read)."""
    paths = list(dict.fromkeys(path for path, _, _ in items))
    if len(paths) > files.limit or len(paths) == len(items):
        pread = files.pread
        return [pread(path, end - start, start) for path, start, end in items]
    with files.held(paths) as fds:
        fd_of = dict(zip(paths, fds))
        return [os.pread(fd_of[path], end - start, start) for path, start, end in items]


def _pread_cached(files: FileSet, items: Sequence[tuple[str, int, int]]) -> list[bytes | None]:
    pread = files.pread_cached
    return [pread(path, end - start, start) for path, start, end in items]


def _credential_safe(exc: Exception) -> Exception:
    """`exc` as our error types, its message free of credentials (fsspec's HTTP errors quote
    signed URLs whole). An HTTP 401/403 is a `PermissionError`, a 404 a `FileNotFoundError`,
    as on gs://, a 408/429/5xx `Transient` (retried), any other status a final `StorageError`
    (fsspec reports every failed size lookup as not found, with the HTTP error as its cause;
    reads raise aiohttp's own)."""
    text = str(exc)
    safe = redact(text)
    status = getattr(exc, "status", None) or getattr(exc.__cause__, "status", None)
    if status in (401, 403):
        return PermissionError(f"HTTP {status}: {safe} (check the credentials: "
                               "storage_options, or the URL's signature and its expiry)")
    if status == 404 and not isinstance(exc, FileNotFoundError):
        return FileNotFoundError(safe)
    if status in (408, 429) or (isinstance(status, int) and status >= 500):
        return Transient(f"HTTP {status}")  # retried, like the same answer from gs://
    if isinstance(status, int) and status != 404:
        return StorageError(f"HTTP {status}: {safe}")  # final: retrying cannot help
    if safe == text:
        return exc
    try:
        return type(exc)(safe)
    except Exception:  # an exception type that wants more than a message
        return StorageError(f"{type(exc).__name__}: {safe}")


def file_info(url: str, meta: dict[str, Any], versions: tuple[str, ...]) -> ObjectInfo:
    """An fsspec `info()` answer as an `ObjectInfo`: the version is the first of the
    metadata fields `versions` that is set."""
    version = next((meta[k] for k in versions if meta.get(k)), "")
    return ObjectInfo(url, int(meta["size"]), str(version))


def listed_files(found: dict[str, dict[str, Any]], url: Callable[[str], str],
                 version: Callable[[dict[str, Any]], str]) -> list[ObjectInfo]:
    """The files of an fsspec `glob(..., detail=True)` answer, sorted by URL."""
    return sorted(ObjectInfo(url(name), int(m["size"]), version(m))
                  for name, m in found.items() if m.get("type", "file") == "file")


async def close_session(fs: Any) -> None:
    """Close an async fsspec filesystem's aiohttp session (gcsfs's, HTTP's) on this loop,
    else aiohttp reports it unclosed at exit."""
    session: Any = getattr(fs, "_session", None)
    if getattr(fs, "close_session", None) is not None and hasattr(session, "close"):
        await session.close()


# fsspec protocols whose filesystem one of our extras installs.
_FSSPEC_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


class FsspecBackend:
    """Any fsspec filesystem but gs:// (s3://, https://, ...): its own reads, listing and
    lookups; errors as ours, free of credentials (`_credential_safe`)."""

    streams = False

    def __init__(self, protocol: str, options: dict[str, Any]) -> None:
        import fsspec

        try:
            cls = fsspec.get_filesystem_class(protocol)
        except ImportError as exc:  # its filesystem's package is not installed
            extra = _FSSPEC_EXTRAS.get(protocol)
            if extra is None:
                raise
            raise MissingExtraError(extra, f"{protocol}://", exc.name) from None
        redact_logs(*STORAGE_LOGGERS, cls.__module__.split(".")[0])  # fsspec logs our URLs
        self.is_async = bool(getattr(cls, "async_impl", False))
        kw: dict[str, Any] = {"skip_instance_cache": True, **options}
        if self.is_async:
            kw.update(asynchronous=True, loop=asyncio.get_running_loop())
        self.fs = cls(**kw)
        self.protocol = protocol

    def _url(self, path: str) -> str:
        return path if "://" in path else f"{self.protocol}://{path}"

    async def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        try:
            if self.is_async:
                return await getattr(self.fs, "_" + name)(*args, **kw)
            return await asyncio.to_thread(getattr(self.fs, name), *args, **kw)
        except Exception as exc:
            safe = _credential_safe(exc)
            if safe is exc:
                raise
            raise safe from None

    async def info(self, path: str) -> ObjectInfo:
        meta = await self._call("info", path)
        return file_info(self._url(path), meta, ("generation", "ETag", "mtime"))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        found = await self._call("glob", pattern, detail=True)
        return listed_files(found, self._url, lambda m: str(m.get("mtime", "")))

    async def read(self, path: str, start: int, end: int) -> bytes:
        try:
            return await self._call("cat_file", path, start=start, end=end)
        except (FileNotFoundError, PermissionError, IsADirectoryError, StorageError):
            raise  # final (a StorageError here is an HTTP status retrying cannot change)
        except (OSError, asyncio.TimeoutError) as exc:
            raise Transient(f"{type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        """Close the filesystem's HTTP session on this loop (else aiohttp reports it
        unclosed at exit): gcsfs keeps an aiohttp `_session`; s3fs an aiobotocore client
        entered from `_s3creator`."""
        if not self.is_async:
            return
        await close_session(self.fs)
        creator = getattr(self.fs, "_s3creator", None)
        if creator is not None and hasattr(creator, "__aexit__"):
            self.fs._s3creator = self.fs._s3 = None  # (its finalizer then has nothing to do)
            await creator.__aexit__(None, None, None)
