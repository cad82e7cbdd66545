"""Which client serves a store's gs:// range reads, and making it: libcurl (`gcs_curl`, about
half the CPU per GET; needs pycurl) where the storage_options are ones it serves, else gcsfs's
own requests (`GcsfsBackend`). Chosen per `Storage` by `gcs_client` or AIOLOADER_GCS_CLIENT
("auto", "curl" or "fsspec").

Why gs:// is not simply `backends.FsspecBackend` over gcsfs: its `_cat_file` runs gcsfs's
retry loop unseen by the `RetryPolicy`, its listings version files by mtime where pins and
cache keys need generations, and a refusal comes back as a plain `OSError`. So both gs://
stores share `gcs_store.GcsStore` (metadata by generation, refusals as `PermissionError`),
and this one sends gcsfs's request (its URL, headers, parameters) on gcsfs's session itself,
once per attempt, and reads the answer's status as libcurl's reads do.
"""

from __future__ import annotations

import asyncio
import os
from importlib.util import find_spec
from typing import Any

from ...errors import StorageError, Transient, Unreachable
from ...options import gcs_client_named
from ...urls import redact
from ..backends import Backend
from ..hedge import Silent
from .store import SERVED_OPTIONS, GcsStore, curl_serves, gcs_failure, range_body

__all__ = ["GcsfsBackend", "gcs_backend", "gcs_client_for"]


def gcs_client_for(client: str | None = None,
                   options: dict[str, Any] | None = None) -> str:
    """Which client gs:// reads use: "curl" or "fsspec" (`client` or AIOLOADER_GCS_CLIENT;
    "auto" picks curl when pycurl is installed and `options` are ones it serves)."""
    client = gcs_client_named(client or os.environ.get("AIOLOADER_GCS_CLIENT") or "auto")
    if client != "auto":
        return client
    if find_spec("pycurl") is None:
        return "fsspec"
    return "curl" if curl_serves(options or {}) else "fsspec"


def gcs_backend(client: str, options: dict[str, Any], connections: int,
                pins: dict[str, str], *, silence: float | None = None) -> Backend:
    """The gs:// backend `client` names: "curl" (libcurl; needs pycurl, in the `gcs` extra),
    "fsspec" (gcsfs's reads), or "auto": curl when pycurl is installed and the
    storage_options are ones it serves, else fsspec. `silence`: the `RetryPolicy`'s timeout,
    which gcsfs's requests need as their own (libcurl's reads tell their progress instead)."""
    if client == "fsspec":
        return GcsfsBackend(options, pins, silence, connections)
    try:
        from .backend import CurlGCSBackend
    except ImportError as exc:
        if client == "curl":
            raise StorageError(
                f"gcs_client='curl' needs pycurl ({exc}): pip install 'aioloader[gcs]' "
                "(or pip install pycurl), or use gcs_client='fsspec'") from None
        return GcsfsBackend(options, pins, silence, connections)
    if curl_serves(options):
        return CurlGCSBackend(options, connections, pins)
    if client == "curl":
        raise StorageError(
            f"gcs_client='curl' reads only with storage_options {sorted(SERVED_OPTIONS)}; "
            f"these need gcsfs's own reads: {sorted(set(options) - SERVED_OPTIONS)} (use "
            "gcs_client='fsspec')")
    return GcsfsBackend(options, pins, silence, connections)


class GcsfsBackend(GcsStore):
    """gs:// reads through gcsfs's own requests (its URL, credentials, session and
    storage_options), pinned to the generation seen at open.

    One attempt per call, as every backend's, and one request per attempt: the GET gcsfs
    would send, sent on its session ourselves, not through its retry loop (six tries, 1-32 s
    sleeps, unseen by the `RetryPolicy`) nor its `validate_response` (which takes any answer
    whose message says "invalid" for a 400, and a 502 for a proxy failure). The session holds
    `connections` connections (gcsfs's default: 100), and aiohttp's silent re-send of a
    request whose kept-alive connection dropped is off: that retry is the policy's, counted.
    An attempt answers only when done (`streams` is false), so silence is timed by aiohttp's
    socket timeouts, `silence` seconds (unless the storage_options set `requests_timeout`),
    and ends the attempt as `Silent`; the rest of the read's deadline bounds it too
    (`retry`). Its errors are the ones libcurl's reads raise for the same answer
    (`gcs_failure`).
    """

    streams = False

    def __init__(self, options: dict[str, Any], pins: dict[str, str],
                 silence: float | None = None, connections: int = 100) -> None:
        super().__init__(options, pins, lazy=True)
        # Made now (gcsfs imported if need be), so that no read's deadline times the import.
        fs = self._filesystem()
        import aiohttp  # (gcsfs's own client: imported with it)

        self._connections = connections
        self._session: Any = None  # gcsfs's session, once set up for our reads
        # The connector gcsfs's session is made with, unless the storage_options bring their
        # own, or gcsfs makes one that presents a client certificate (then it is resized).
        self._resize = "connector" not in fs.session_kwargs
        if self._resize and not (getattr(fs, "_use_client_cert", False)
                                 and str(getattr(fs, "_location", "")).startswith("https://")):
            fs.session_kwargs = {**fs.session_kwargs, "connector": aiohttp.TCPConnector(
                limit=connections, ttl_dns_cache=300)}
        self._silence = silence if "requests_timeout" not in options else None
        if self._silence is not None:
            fs.requests_timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self._silence, sock_read=self._silence)

    async def _http(self, fs: Any) -> Any:
        """gcsfs's aiohttp session (made on first need), set up for our reads."""
        session = fs._session
        if session is None or session is not self._session:
            session = await fs._set_session()
            # Every retry goes through the RetryPolicy (backoff, deadline, stats).
            if hasattr(session, "_retry_connection"):
                session._retry_connection = False
            connector = session.connector
            if self._resize and connector is not None and hasattr(connector, "_limit"):
                connector._limit = self._connections  # (a connector gcsfs made)
            self._session = session
        return session

    async def read(self, path: str, start: int, end: int) -> bytes:
        generation = self._generation(path)
        fs = await self._gcsfs()
        headers = {"Range": f"bytes={start}-{end - 1}"}
        try:
            session = await self._http(fs)
            if hasattr(fs, "_get_headers"):  # (its User-Agent and credentials)
                headers = fs._get_headers(headers)
            else:  # pragma: no cover - an older gcsfs
                fs.credentials.apply(headers)
            params = fs._get_params({}) if hasattr(fs, "_get_params") else {}
            async with session.get(fs.url(path, generation=generation), params=params,
                                   headers=headers, timeout=fs.requests_timeout) as resp:
                status, body = resp.status, await resp.read()
        except Exception as exc:
            raise self._failure(exc) from None
        if status not in (200, 206):
            raise gcs_failure(self._key(path), status,
                              redact(body[:200].decode("utf-8", "replace")), generation,
                              self._hint)
        out = range_body(status, body, start, end, None)
        assert out is not None
        return out

    def _failure(self, exc: Exception) -> BaseException:
        """A failure with no answer as ours: silence `Silent`, a connection never made
        `Unreachable`, any other network failure `Transient`; the rest as raised."""
        import aiohttp

        text = f"{type(exc).__name__}: {redact(str(exc))}"
        if isinstance(exc, aiohttp.ServerTimeoutError) and self._silence is not None:
            return Silent(f"no answer within {self._silence:g} s")  # (as libcurl's reads say)
        if (isinstance(exc, aiohttp.ClientConnectorError)
                and not isinstance(exc, aiohttp.ClientSSLError)):
            return Unreachable(text)
        if isinstance(exc, (OSError, asyncio.TimeoutError, aiohttp.ClientError)):
            return Transient(text)
        return exc
