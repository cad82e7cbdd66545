"""Which client serves gs:// range reads, and making it: libcurl (`gcs_curl`, about half the
CPU per GET; needs pycurl) or aiohttp (`gcs_aiohttp`), chosen per Storage by `gcs_client`
or AIOLOADER_GCS_CLIENT."""

from __future__ import annotations

import os
from typing import Any

from .errors import StorageError
from .gcs_aiohttp import GCSBackend

GCS_CLIENTS = ("auto", "curl", "aiohttp")


def gcs_client_for(client: str | None = None,
                   options: dict[str, Any] | None = None) -> str:
    """Which client gs:// reads use: "curl" or "aiohttp" (`client` or AIOLOADER_GCS_CLIENT;
    "auto" picks curl when pycurl is installed and `options` are ones it serves)."""
    client = client or os.environ.get("AIOLOADER_GCS_CLIENT") or "auto"
    if client != "auto":
        return client
    from importlib.util import find_spec

    if find_spec("pycurl") is None:
        return "aiohttp"
    return "curl" if set(options or {}) <= _CURL_OPTIONS else "aiohttp"


# storage_options the curl backend serves (gcs_curl.SERVED_OPTIONS, without importing it).
_CURL_OPTIONS = frozenset({"token", "endpoint_url", "project", "access"})


def gcs_backend(client: str, options: dict[str, Any], connections: int,
                pins: dict[str, str]) -> Any:
    """The gs:// backend `client` names: "curl" (libcurl, about half the CPU per GET; needs
    pycurl, in the `gcs` extra), "aiohttp", or "auto": curl when pycurl is installed and the
    storage_options are ones it serves, else aiohttp."""
    if client != "aiohttp":
        try:
            from .gcs_curl import SERVED_OPTIONS, CurlGCSBackend, curl_serves
        except ImportError as exc:
            if client == "curl":
                raise StorageError(
                    f"gcs_client='curl' needs pycurl ({exc}): pip install 'aioloader[gcs]' "
                    "(or pip install pycurl), or use gcs_client='aiohttp'") from None
        else:
            if curl_serves(options):
                return CurlGCSBackend(options, connections, pins)
            if client == "curl":
                raise StorageError(
                    "gcs_client='curl' reads only with storage_options "
                    f"{sorted(SERVED_OPTIONS)}; these need gcsfs's own reads: "
                    f"{sorted(set(options) - SERVED_OPTIONS)} (use gcs_client='aiohttp')")
    return GCSBackend(options, connections, pins)
