"""What every gs:// store shares: gcsfs for listing, metadata and credentials (`GcsStore`),
and the rules for reading GCS's answers (errors, suffix-range tails, range bodies).

The reads themselves differ by client: libcurl (`gcs_curl.CurlGCSBackend`, where pycurl is
installed and the storage_options are ones it serves: `SERVED_OPTIONS`) or gcsfs's own reads
(`gcs_client.GcsfsBackend`); `gcs_client.gcs_backend` chooses. gcsfs is made only when first
needed, on the loop that uses it: with no credentials to fetch, opening files by name and
reading them on libcurl never imports it (~0.7-1.3 s in a new process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from ...errors import MissingExtraError, ObjectChangedError, StorageError, Transient
from ...preimport import import_started
from ...urls import STORAGE_LOGGERS, redact, redact_logs
from ..backends import ObjectInfo, Tail, close_session, file_info, listed_files
from ..reach import NO_CREDENTIALS, gcs_credentials_found, guarded

__all__ = ["SERVED_OPTIONS", "GcsStore", "curl_serves", "gcs_auth_hint", "gcs_endpoint",
           "gcs_failure", "gcs_key", "gcs_options", "gcsfs_filesystem", "gcsfs_status",
           "parse_tail", "range_body"]

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# "bytes 0-99/100"; an empty object on fake-gcs-server: "bytes 0--1/0".
_CONTENT_RANGE = re.compile(r"bytes (?P<first>-?\d+)-(?P<last>-?\d+)/(?P<size>\d+)")
DEFAULT_GCS_ENDPOINT = "https://storage.googleapis.com"

# storage_options the libcurl reads honour themselves; any other (requester pays, a custom
# session, ...) changes how gcsfs reads, so such stores read through gcsfs.
SERVED_OPTIONS = frozenset({"token", "endpoint_url", "project", "access"})


def curl_serves(options: dict[str, Any]) -> bool:
    """Whether reads with these storage_options can go through libcurl."""
    return set(options) <= SERVED_OPTIONS


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
    ~16 s asking for a metadata server that is not there: `aioloader.io.reach`)."""
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


def gcsfs_status(exc: BaseException) -> int | None:
    """The HTTP status a gcsfs error reports (None: not an answer, e.g. a network failure)."""
    if isinstance(exc, FileNotFoundError):
        return 404
    code = getattr(exc, "code", None)  # gcsfs's HttpError
    if isinstance(code, int):
        return code
    text = str(exc)
    if isinstance(exc, ValueError) and text.startswith("Bad Request"):
        return 400
    if type(exc) is OSError and text.startswith("Forbidden"):
        return 403
    return None


class GcsStore:
    """A gs:// store's metadata side: gcsfs's filesystem, made on first need (its import
    started at once, unless `lazy` and the store is anonymous: no credentials to fetch, so
    reads that list nothing never import it), listings and lookups through it (the first one
    guarded by a probe of the endpoint: `aioloader.io.reach`), and the generations reads are
    pinned to (`pins`, shared with the `Storage`). Subclasses add the reads."""

    def __init__(self, options: dict[str, Any], pins: dict[str, str], *,
                 lazy: bool = False) -> None:
        self.pins = pins
        self._options = gcs_options(options)
        self._base = gcs_endpoint(self._options)
        self._hint = gcs_auth_hint(options)
        self._reached = False  # a metadata call succeeded: the endpoint needs no probe
        self._anon = self._options.get("token") == "anon"
        self._fs: Any = None
        self._import: Future | None = (None if lazy and self._anon else
                                       import_started("gcsfs"))

    _key = staticmethod(gcs_key)

    async def _gcsfs(self) -> Any:
        """gcsfs's filesystem (listing, metadata, credentials), made on first need."""
        if self._fs is None:
            if self._import is None:
                self._import = import_started("gcsfs")
            with contextlib.suppress(ImportError):  # gcsfs_filesystem says which extra
                await asyncio.wrap_future(self._import)
            if self._fs is None:
                self._filesystem()
        return self._fs

    def _filesystem(self) -> Any:
        """Make gcsfs's filesystem now, on this loop (importing gcsfs if need be)."""
        redact_logs(*STORAGE_LOGGERS)
        self._fs = gcsfs_filesystem(self._options)
        return self._fs

    async def prepare(self) -> None:
        """Import and make gcsfs's filesystem now (before a metadata call's deadline)."""
        await self._gcsfs()

    async def _meta(self, path: str, call: Callable[[Any], Awaitable[Any]]) -> Any:
        """A gcsfs call (`call(fs)`), failing at once if the endpoint is unreachable (gcsfs
        retries that for ~30 s: `aioloader.io.reach`)."""
        async def once() -> Any:
            try:
                return await call(await self._gcsfs())
            except Exception as exc:  # a refusal: as the reads say it (the rest: as gcsfs does)
                status = gcsfs_status(exc)
                if status not in (401, 403):
                    raise
                raise gcs_failure(gcs_key(path), status, redact(str(exc)), None,
                                  self._hint) from None

        if self._reached:
            return await once()
        out = await guarded(gcs_key(path), self._base, once())
        self._reached = True
        return out

    async def info(self, path: str) -> ObjectInfo:
        meta = await self._meta(path, lambda fs: fs._info(path))
        if meta.get("type") == "directory":
            raise IsADirectoryError(path)
        return file_info(self._key(path), meta, ("generation", "etag"))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        found = await self._meta(pattern, lambda fs: fs._glob(pattern, detail=True))
        return listed_files(found, self._key, lambda m: str(m.get("generation") or ""))

    def _generation(self, path: str) -> str | None:
        """The generation reads of `path` are pinned to (None: not pinned)."""
        return self.pins.get(self._key(path)) or None

    async def aclose(self) -> None:
        if self._fs is not None:
            await close_session(self._fs)
