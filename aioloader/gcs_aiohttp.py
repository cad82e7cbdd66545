"""gs:// range reads on our own aiohttp session (`gcs_client.gcs_backend` picks it, or libcurl's
`gcs_curl.CurlGCSBackend` where pycurl is installed): gcsfs for listing, metadata and
credentials; one suffix-range GET opens an object (tail, size and generation in one answer);
reads pinned to the generation seen at open. See `backends` for what a backend is.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

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
from .errors import MissingExtraError, Transient, Unreachable
from .reach import guarded


class GCSBackend:
    streams = True  # reads take a `retry.Watch`: silence is timed, slow heads are hedged

    def __init__(self, options: dict[str, Any], connections: int,
                 pins: dict[str, str]) -> None:
        self.pins = pins
        try:
            import aiohttp
            import yarl
        except ImportError as exc:
            raise MissingExtraError("gcs", "gs://", exc.name) from None

        opts = gcs_options(options)
        self._endpoint = gcs_endpoint(opts)
        self._hint = gcs_auth_hint(options)
        self._reached = False  # a metadata call succeeded: the endpoint needs no probe
        self.fs = gcsfs_filesystem(opts)
        self._aiohttp = aiohttp
        self._yarl_url = yarl.URL
        self._urls: dict[tuple[str, str | None], yarl.URL] = {}
        # No timeouts here: the caller's watch times silence (a whole-request timeout would
        # cut a large download that is still receiving bytes).
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=None, sock_read=None),
            auto_decompress=False,
        )
        # aiohttp silently re-sends an idempotent request once when its connection drops;
        # every retry must go through our RetryPolicy (backoff, deadline, stats) instead.
        if hasattr(self.session, "_retry_connection"):
            self.session._retry_connection = False

    _key = staticmethod(gcs_key)

    async def _meta(self, path: str, call: Any) -> Any:
        """A gcsfs call, failing at once if the endpoint is unreachable (gcsfs retries that
        for ~30 s: `aioloader.reach`)."""
        if self._reached:
            return await call
        out = await guarded(gcs_key(path), self._endpoint, call)
        self._reached = True
        return out

    async def info(self, path: str) -> ObjectInfo:
        meta = await self._meta(path, self.fs._info(path))
        if meta.get("type") == "directory":
            raise IsADirectoryError(path)
        return ObjectInfo(self._key(path), int(meta["size"]),
                          str(meta.get("generation") or meta.get("etag") or ""))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        found = await self._meta(pattern, self.fs._glob(pattern, detail=True))
        return sorted(
            (ObjectInfo(self._key(name), int(m["size"]), str(m.get("generation") or ""))
             for name, m in found.items() if m.get("type", "file") == "file"),
        )

    def _http_url(self, path: str, generation: str | None) -> Any:
        """The download URL, parsed once per object and generation: gcsfs's `url()` (path
        splitting, quoting) and yarl's parsing cost more than the rest of our per-GET code."""
        url = self._urls.get((path, generation))
        if url is None:
            text = self.fs.url(path, generation=generation)
            # The query parameters gcsfs adds to its own requests (`userProject` for
            # requester_pays), which `url()` leaves out.
            params: dict[str, str] = getattr(self.fs, "_get_params", lambda kw: {})({})
            if params:
                text += "&" + urlencode(params)
            url = self._urls[(path, generation)] = self._yarl_url(text)
        return url

    async def read(self, path: str, start: int, end: int, watch: Any = None) -> bytes:
        return await self._get(path, start, end, None, watch)

    async def read_into(self, path: str, start: int, end: int, dest: memoryview,
                        watch: Any = None) -> None:
        """Bytes `[start, end)` written into `dest` as they arrive: a large read (a segment
        of a dataset kept in memory) lands where it is kept, not joined and copied there."""
        await self._get(path, start, end, dest, watch)

    @staticmethod
    async def _body(resp: Any, watch: Any) -> bytes:
        """The whole response body, telling `watch` as each chunk arrives."""
        if watch is None:
            return await resp.read()
        chunks = []
        async for chunk in resp.content.iter_any():
            watch.progress()
            chunks.append(chunk)
        return b"".join(chunks)

    async def _get(self, path: str, start: int, end: int, dest: memoryview | None,
                   watch: Any) -> Any:
        n = end - start
        headers = {"Range": f"bytes={start}-{end - 1}"}
        self.fs.credentials.apply(headers)
        generation = self.pins.get(self._key(path)) or None
        try:
            async with self.session.get(self._http_url(path, generation),
                                        headers=headers) as resp:
                if watch is not None:
                    watch.answered()
                status = resp.status
                if status == 206 and dest is not None:
                    got = 0
                    async for chunk in resp.content.iter_any():
                        if watch is not None:
                            watch.progress()
                        k = len(chunk)
                        if got + k > n:
                            raise Transient(f"long body (over {n} bytes)")
                        dest[got : got + k] = chunk
                        got += k
                    if got != n:
                        raise Transient(f"short body ({got} of {n} bytes)")
                    return None
                if status in (200, 206):
                    return range_body(status, await self._body(resp, watch), start, end, dest)
                text = (await resp.read())[:200].decode("utf-8", "replace")
        except self._aiohttp.ClientError as exc:
            raise _client_error(exc) from None
        raise self._failure(path, status, text, generation)

    async def read_tail(self, path: str, n: int, watch: Any = None) -> Tail | None:
        """Size, generation and the last `n` bytes (all of a smaller object) in one GET.

        None when the answer cannot give them (416: an empty object on real GCS; no
        `x-goog-generation` header): the caller then asks `info()` and reads as usual.
        """
        headers = {"Range": f"bytes=-{n}"}
        self.fs.credentials.apply(headers)
        body, generation, content_range = b"", "", ""
        try:
            async with self.session.get(self._http_url(path, None), headers=headers) as resp:
                if watch is not None:
                    watch.answered()
                status = resp.status
                if status in (200, 206):
                    body = await self._body(resp, watch)
                    generation = resp.headers.get("x-goog-generation", "")
                    content_range = resp.headers.get("Content-Range", "")
                else:
                    text = (await resp.read())[:200].decode("utf-8", "replace")
        except self._aiohttp.ClientError as exc:
            raise _client_error(exc) from None
        if status not in (200, 206, 416):
            raise gcs_failure(self._key(path), status, text, None, self._hint)
        return parse_tail(self._key(path), n, status, body, content_range, generation)

    def _failure(self, path: str, status: int, text: str, generation: str | None) -> Exception:
        return gcs_failure(self._key(path), status, text, generation, self._hint)

    async def aclose(self) -> None:
        await self.session.close()
        if getattr(self.fs, "_session", None) is not None:
            await self.fs.session.close()


def _client_error(exc: Exception) -> Transient:
    """An aiohttp failure as a retriable one; one that never connected is `Unreachable`
    (a TLS failure is not: it did reach a server)."""
    import aiohttp

    never_connected = (isinstance(exc, aiohttp.ClientConnectorError)
                       and not isinstance(exc, aiohttp.ClientSSLError))
    return (Unreachable if never_connected else Transient)(f"{type(exc).__name__}: {exc}")
