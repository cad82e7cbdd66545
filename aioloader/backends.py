"""Storage backends: how one range read, size lookup or listing is done on each kind of store.

- local paths: `os.pread` on a descriptor kept open (at most as many as the process's limit
  allows: `descriptors`), in a thread pool we size ourselves, with
  batched preads (one thread hop for many page-cache reads), and a listing in one job;
- gs://: gcsfs for listing, metadata and credentials, but range GETs on our own aiohttp
  session. gcsfs wraps every request in its own retry loop (six tries, 1-32 s sleeps) that
  cannot be turned off per instance; reading through it would hide retries from our stats
  and stretch a 503 into seconds. Our session also lifts the 100-connection cap, and reads
  are pinned to the object generation seen at open. Opening an object by name is one
  suffix-range GET: its response carries the tail bytes, the size (`Content-Range`) and the
  generation (`x-goog-generation`), where gcsfs's `info()` costs ~3 metadata requests
  (`gcs_aiohttp.GCSBackend`; the gs:// helpers both clients share live here);
- gs:// with pycurl installed (the default then): the same reads on libcurl instead of
  aiohttp, at about half the CPU per GET (`gcs_curl.CurlGCSBackend`; `gcs_client.gcs_backend`
  chooses);
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
import re
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from .descriptors import FileSet
from .errors import MissingExtraError, ObjectChangedError, StorageError, Transient
from .reach import NO_CREDENTIALS, gcs_credentials_found
from .urls import STORAGE_LOGGERS, redact, redact_logs

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# "bytes 0-99/100"; an empty object on fake-gcs-server: "bytes 0--1/0".
_CONTENT_RANGE = re.compile(r"bytes (?P<first>-?\d+)-(?P<last>-?\d+)/(?P<size>\d+)")


class ObjectInfo(NamedTuple):
    """What opening a file needs: its size, and a version that changes when it is rewritten."""

    url: str
    size: int
    version: str


class Tail(NamedTuple):
    """An object's size and version with its last `len(data)` bytes, from one request."""

    info: ObjectInfo
    data: bytes



def gcs_key(path: str) -> str:
    """An object's canonical URL (gcsfs lists `bucket/name`; `gcs://` is an alias)."""
    return path if path.startswith("gs://") else "gs://" + path.removeprefix("gcs://")


def gcs_failure(url: str, status: int, text: str, generation: str | None,
                hint: str = "") -> Exception:
    """The error for a non-2xx answer from GCS (`Transient` when worth retrying); `hint`
    says why a refusal may have come (`gcs_auth_hint`)."""
    if status == 404:
        if generation:
            return ObjectChangedError(
                f"{url} was replaced or deleted after it was opened (generation "
                f"{generation} is gone); re-open the dataset to read the new object"
            )
        return FileNotFoundError(f"no such object: {url}")
    if status in (401, 403):
        return PermissionError(f"HTTP {status} reading {url}: {text} ("
                               + (hint or "check credentials or storage_options['token']")
                               + ")")
    if status in RETRY_STATUSES:
        return Transient(f"HTTP {status}")
    return StorageError(f"HTTP {status} from {url}: {text}")


def parse_tail(url: str, n: int, status: int, body: bytes, content_range: str,
               generation: str) -> Tail | None:
    """A suffix-range GET's answer (200, 206 or 416) as a `Tail`; None when it cannot give
    size and generation (416: an empty object on real GCS; no generation header)."""
    if status == 416:
        return None
    if status == 200:  # the whole object: smaller than n, or the range was ignored
        size, body = len(body), body[-n:] if len(body) > n else body
    else:
        m = _CONTENT_RANGE.fullmatch(content_range.strip())
        size = int(m["size"]) if m else -1
        if m is None or (int(m["first"]), int(m["last"])) != (size - min(n, size), size - 1):
            raise StorageError(f"{url}: asked for the last {n} bytes, the answer was 206 with "
                               f"Content-Range {content_range!r} (not the tail: is the "
                               "endpoint a GCS-compatible server?)")
        if len(body) != min(n, size):
            raise Transient(f"short body ({len(body)} of {min(n, size)} bytes)")
    if not generation:
        return None
    return Tail(ObjectInfo(url, size, generation), body)



class LocalBackend:
    """Local files: a listing is one thread-pool job (glob, then one `stat` per match, for
    both "is it a file" and its size and version); reads are `os.pread` on descriptors kept
    open (`descriptors`: the process's capped set), opened inside the thread-pool job that
    first reads them (an `open` is ~20-40 µs, which the event loop need not spend: a cold
    open of 2,000 shards opens 2,000 files)."""

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

    async def aclose(self) -> None:
        self._pool.shutdown(wait=True)  # first: no job is reading any more
        self._files.close()


def local_version(st: os.stat_result) -> str:
    """A local file's version: what a rewrite changes. mtime alone is not enough (`cp -p`
    and `rsync -a` restore it); ctime cannot be set back, and a file replaced by a rename
    has another inode. (A chmod changes ctime too: a needless miss, not a wrong read.)"""
    return f"{st.st_mtime_ns}.{st.st_ctime_ns}.{st.st_dev}.{st.st_ino}"


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


def range_body(status: int, body: bytes, start: int, end: int,
               dest: memoryview | None) -> bytes | None:
    """Bytes [start, end) of a range GET's 200/206 answer (a server that ignored the range
    sent the whole object), checked for length; into `dest` when given (then None)."""
    n = end - start
    if status == 200 and len(body) > n:
        body = body[start:end]
    if len(body) != n:
        raise Transient(f"short body ({len(body)} of {n} bytes)")
    if dest is None:
        return body
    dest[:n] = body
    return None


DEFAULT_GCS_ENDPOINT = "https://storage.googleapis.com"


def gcs_endpoint(options: dict[str, Any]) -> str:
    """gcsfs's choice of endpoint: `endpoint_url`, else `STORAGE_EMULATOR_HOST`, else GCS."""
    url = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST", "")
    if url in ("", "default"):
        return DEFAULT_GCS_ENDPOINT
    return (url if url.startswith(("http://", "https://")) else f"http://{url}").rstrip("/")


def gcs_auth_hint(options: dict[str, Any]) -> str:
    """Why GCS may refuse us: no credentials anywhere (then reads go anonymous at once,
    see `gcs_options`), else nothing to add."""
    if "token" in options or os.environ.get("STORAGE_EMULATOR_HOST"):
        return ""
    return "" if gcs_credentials_found(options) else NO_CREDENTIALS


def gcs_options(options: dict[str, Any]) -> dict[str, Any]:
    """A copy of gs:// storage options; anonymous against an emulator (it takes no
    credentials), and where no credentials can be found (gcsfs would end there too, after
    ~16 s asking for a metadata server that is not there: `aioloader.reach`)."""
    opts = dict(options)
    if "token" not in opts and (os.environ.get("STORAGE_EMULATOR_HOST")
                                or gcs_auth_hint(opts)):
        opts["token"] = "anon"
    return opts


def gcsfs_filesystem(options: dict[str, Any]) -> Any:
    """gcsfs's async filesystem for gs:// (listing, metadata, credentials) on this loop.

    Against an emulator (``STORAGE_EMULATOR_HOST``) always gcsfs's plain class: the one
    ``gcsfs.GCSFileSystem`` names when gcsfs was imported with its experimental HNS support
    on (its default) probes a gRPC API that emulators lack, stalling each call for 30-50 s.
    """
    try:
        import gcsfs
        import gcsfs.core
    except ImportError as exc:
        raise MissingExtraError("gcs", "gs://", exc.name) from None
    cls = gcsfs.core.GCSFileSystem if os.environ.get("STORAGE_EMULATOR_HOST") else (
        gcsfs.GCSFileSystem)
    return cls(asynchronous=True, skip_instance_cache=True, loop=asyncio.get_running_loop(),
               **options)


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


# fsspec protocols whose filesystem one of our extras installs.
_FSSPEC_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


class FsspecBackend:
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
        version = meta.get("generation") or meta.get("ETag") or meta.get("mtime") or ""
        return ObjectInfo(self._url(path), int(meta["size"]), str(version))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        found = await self._call("glob", pattern, detail=True)
        return sorted(ObjectInfo(self._url(n), int(m["size"]), str(m.get("mtime", "")))
                      for n, m in found.items() if m.get("type", "file") == "file")

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
        session: Any = getattr(self.fs, "_session", None)
        if getattr(self.fs, "close_session", None) is not None and hasattr(session, "close"):
            await session.close()
        creator = getattr(self.fs, "_s3creator", None)
        if creator is not None and hasattr(creator, "__aexit__"):
            self.fs._s3creator = self.fs._s3 = None  # (its finalizer then has nothing to do)
            await creator.__aexit__(None, None, None)
