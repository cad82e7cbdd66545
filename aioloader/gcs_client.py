"""Which client serves a store's gs:// range reads, and making it: libcurl (`gcs_curl`, about
half the CPU per GET; needs pycurl) where the storage_options are ones it serves, else gcsfs's
own requests (`GcsfsBackend`). Chosen per `Storage` by `gcs_client` or AIOLOADER_GCS_CLIENT
("auto", "curl" or "fsspec").

Why gs:// is not simply `backends.FsspecBackend` over gcsfs: its `_cat_file` runs gcsfs's
retry loop unseen by the `RetryPolicy`, its listings version files by mtime where pins and
cache keys need generations, and a refusal comes back as a plain `OSError`. So both gs://
stores share `gcs_store.GcsStore` (metadata by generation, refusals as `PermissionError`),
and this one sends gcsfs's own request once per attempt.
"""

from __future__ import annotations

import asyncio
import os
from importlib.util import find_spec
from typing import Any

from .backends import Backend
from .errors import StorageError, Transient, Unreachable
from .gcs_store import (
    SERVED_OPTIONS,
    GcsStore,
    curl_serves,
    gcs_failure,
    gcsfs_status,
    range_body,
)
from .hedge import Silent
from .options import gcs_client_named
from .urls import redact

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
        return GcsfsBackend(options, pins, silence)
    try:
        from .gcs_curl import CurlGCSBackend
    except ImportError as exc:
        if client == "curl":
            raise StorageError(
                f"gcs_client='curl' needs pycurl ({exc}): pip install 'aioloader[gcs]' "
                "(or pip install pycurl), or use gcs_client='fsspec'") from None
        return GcsfsBackend(options, pins, silence)
    if curl_serves(options):
        return CurlGCSBackend(options, connections, pins)
    if client == "curl":
        raise StorageError(
            f"gcs_client='curl' reads only with storage_options {sorted(SERVED_OPTIONS)}; "
            f"these need gcsfs's own reads: {sorted(set(options) - SERVED_OPTIONS)} (use "
            "gcs_client='fsspec')")
    return GcsfsBackend(options, pins, silence)


class GcsfsBackend(GcsStore):
    """gs:// reads through gcsfs's own requests (its URL, credentials, session and
    storage_options), pinned to the generation seen at open.

    One attempt per call, as every backend's: the request gcsfs's retry loop wraps (six
    tries, 1-32 s sleeps, unseen by the `RetryPolicy`) is sent once, where this gcsfs has it
    (else its `_cat_file`, loop and all). An attempt answers only when done (`streams` is
    false), so silence is timed by aiohttp's socket timeouts, `silence` seconds (unless the
    storage_options set `requests_timeout`), and ends the attempt as `Silent`; the rest of
    the read's deadline bounds it too (`retry`). Its errors are the ones libcurl's reads
    raise for the same answer (`gcs_failure`).
    """

    streams = False

    def __init__(self, options: dict[str, Any], pins: dict[str, str],
                 silence: float | None = None) -> None:
        super().__init__(options, pins, lazy=True)
        # Made now (gcsfs imported if need be), so that no read's deadline times the import.
        fs = self._filesystem()
        self._silence = silence if "requests_timeout" not in options else None
        if self._silence is not None:
            import aiohttp

            fs.requests_timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self._silence, sock_read=self._silence)

    async def read(self, path: str, start: int, end: int) -> bytes:
        generation = self._generation(path)
        fs = await self._gcsfs()
        try:
            request = getattr(type(fs)._request, "__wrapped__", None)
            if request is None:  # pragma: no cover - a gcsfs without `retry_request`
                return await fs._cat_file(path, start=start, end=end, generation=generation)
            status, _, _, body = await request(fs, "GET", fs.url(path, generation=generation),
                                               headers={"Range": f"bytes={start}-{end - 1}"})
        except Exception as exc:
            raise self._failure(path, exc, generation) from None
        out = range_body(status, body, start, end, None)
        assert out is not None
        return out

    def _failure(self, path: str, exc: Exception, generation: str | None) -> BaseException:
        """gcsfs's error for a read as ours: an answer's status as `gcs_failure` says; a
        connection never made `Unreachable`; any other network failure `Transient`."""
        status = gcsfs_status(exc)
        if status is not None:
            return gcs_failure(self._key(path), status, redact(str(exc)), generation,
                               self._hint)
        import aiohttp  # (gcsfs's own client: imported with it)

        text = f"{type(exc).__name__}: {redact(str(exc))}"
        if isinstance(exc, aiohttp.ServerTimeoutError) and self._silence is not None:
            return Silent(f"no answer within {self._silence:g} s")  # (as libcurl's reads say)
        if (isinstance(exc, aiohttp.ClientConnectorError)
                and not isinstance(exc, aiohttp.ClientSSLError)):
            return Unreachable(text)
        if isinstance(exc, (OSError, asyncio.TimeoutError, aiohttp.ClientError)):
            return Transient(text)
        return exc
