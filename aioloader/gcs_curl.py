"""gs:// range reads on libcurl (`curl.CurlSession`): the same reads as `GCSBackend`, at about
half the client CPU per GET (benchmarks/request_cost.py; RESULTS.md "Issue 15: cost per
request").

Only the reads move: listing, metadata lookups and credentials stay gcsfs's, which is made
only when one of them is first needed. With no credentials to fetch (`token="anon"`, or an
emulator), opening files by name and reading them never imports gcsfs (~0.7-1.3 s in a new
process) nor aiohttp; with credentials, gcsfs is imported on a thread from the moment the
backend is made, so the import overlaps the rest of start-up.

Same contract as `GCSBackend`: one attempt per call, `Transient` for what is worth retrying,
reads pinned to the generation seen at open, progress told to the caller's `retry.Watch` (the
head counts as heard with the first body bytes), no timeouts of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future
from typing import Any
from urllib.parse import quote

from .backends import (
    ObjectInfo,
    Tail,
    gcs_auth_hint,
    gcs_endpoint,
    gcs_failure,
    gcs_key,
    gcs_options,
    gcsfs_filesystem,
    parse_tail,
    range_body,
)
from .curl import CurlSession
from .errors import Transient
from .preimport import import_started
from .reach import guarded
from .urls import STORAGE_LOGGERS, redact, redact_logs

__all__ = ["CurlGCSBackend", "curl_serves"]

# storage_options this backend's reads honour themselves; any other (requester pays, a
# custom session, ...) changes how gcsfs reads, so such stores keep the aiohttp backend.
SERVED_OPTIONS = frozenset({"token", "endpoint_url", "project", "access"})  # = storage's


def curl_serves(options: dict[str, Any]) -> bool:
    """Whether reads with these storage_options can go through libcurl."""
    return set(options) <= SERVED_OPTIONS


class CurlGCSBackend:
    streams = True  # reads take a `retry.Watch`: silence is timed, slow heads are hedged

    def __init__(self, options: dict[str, Any], connections: int,
                 pins: dict[str, str]) -> None:
        self.pins = pins
        opts = gcs_options(options)
        self._options = opts
        self._anon = opts.get("token") == "anon"
        self._base = gcs_endpoint(opts)
        self._hint = gcs_auth_hint(options)
        self._reached = False  # a metadata call succeeded: the endpoint needs no probe
        self._urls: dict[tuple[str, str | None], str] = {}
        self._fs: Any = None
        self._import: Future | None = None
        if not self._anon:  # the first read needs a token: start gcsfs's import now
            self._import = import_started("gcsfs")
        self.session = CurlSession(connections, multiplex=self._base.startswith("https:"))

    _key = staticmethod(gcs_key)

    async def _gcsfs(self) -> Any:
        """gcsfs's filesystem (listing, metadata, credentials), made on first need."""
        if self._fs is None:
            if self._import is None:
                self._import = import_started("gcsfs")
            with contextlib.suppress(ImportError):  # gcsfs_filesystem says which extra
                await asyncio.wrap_future(self._import)
            if self._fs is None:
                redact_logs(*STORAGE_LOGGERS)
                self._fs = gcsfs_filesystem(self._options)
        return self._fs

    async def prepare(self) -> None:
        """Import and make gcsfs's filesystem now (before a metadata call's deadline)."""
        await self._gcsfs()

    async def _auth(self) -> list[str]:
        """The request headers that carry credentials (none for anonymous access)."""
        if self._anon:
            return []
        headers: dict[str, str] = {}
        (await self._gcsfs()).credentials.apply(headers)
        return [f"{k}: {v}" for k, v in headers.items()]

    async def _meta(self, path: str, call: Any) -> Any:
        """A gcsfs call (`call(fs)`), failing at once if the endpoint is unreachable (gcsfs
        retries that for ~30 s: `aioloader.reach`)."""
        if self._reached:
            return await call(await self._gcsfs())

        async def first() -> Any:
            return await call(await self._gcsfs())

        out = await guarded(gcs_key(path), self._base, first())
        self._reached = True
        return out

    async def info(self, path: str) -> ObjectInfo:
        meta = await self._meta(path, lambda fs: fs._info(path))
        if meta.get("type") == "directory":
            raise IsADirectoryError(path)
        return ObjectInfo(self._key(path), int(meta["size"]),
                          str(meta.get("generation") or meta.get("etag") or ""))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        found = await self._meta(pattern, lambda fs: fs._glob(pattern, detail=True))
        return sorted(
            (ObjectInfo(self._key(name), int(m["size"]), str(m.get("generation") or ""))
             for name, m in found.items() if m.get("type", "file") == "file"),
        )

    def _http_url(self, path: str, generation: str | None) -> str:
        """The JSON API download URL, built once per object and generation."""
        url = self._urls.get((path, generation))
        if url is None:
            bucket, _, name = self._key(path)[5:].partition("/")
            url = (f"{self._base}/download/storage/v1/b/{quote(bucket, safe='')}/o/"
                   f"{quote(name, safe='')}?alt=media")
            if generation:
                url += f"&generation={generation}"
            self._urls[(path, generation)] = url
        return url

    async def read(self, path: str, start: int, end: int, watch: Any = None) -> bytes:
        return await self._get(path, start, end, None, watch)

    async def read_into(self, path: str, start: int, end: int, dest: memoryview,
                        watch: Any = None) -> None:
        """Bytes `[start, end)` written into `dest` as they arrive (see `GCSBackend`)."""
        await self._get(path, start, end, dest, watch)

    async def _get(self, path: str, start: int, end: int, dest: memoryview | None,
                   watch: Any) -> Any:
        n = end - start
        generation = self.pins.get(self._key(path)) or None
        auth = [] if self._anon else await self._auth()
        resp = await self.session.get(self._http_url(path, generation), start, end, auth,
                                      dest=dest, watch=watch)
        status = resp.status
        if status == 206 and dest is not None:
            if resp.got != n:
                raise Transient(f"short body ({resp.got} of {n} bytes)")
            return None
        if status in (200, 206):
            return range_body(status, resp.body, start, end, dest)
        raise gcs_failure(self._key(path), status, _text(resp.body), generation,
                          self._hint)

    async def read_tail(self, path: str, n: int, watch: Any = None) -> Tail | None:
        """Size, generation and the last `n` bytes in one GET (see `GCSBackend.read_tail`)."""
        auth = [] if self._anon else await self._auth()
        resp = await self.session.get(self._http_url(path, None), None, n, auth, watch=watch,
                                      headers=True)
        if resp.status not in (200, 206, 416):
            raise gcs_failure(self._key(path), resp.status, _text(resp.body), None,
                              self._hint)
        return parse_tail(self._key(path), n, resp.status, resp.body,
                          resp.header_value("Content-Range"),
                          resp.header_value("x-goog-generation"))

    async def aclose(self) -> None:
        await self.session.aclose()
        if self._fs is not None and getattr(self._fs, "_session", None) is not None:
            await self._fs.session.close()


def _text(body: bytes) -> str:
    return redact(body[:200].decode("utf-8", "replace"))
