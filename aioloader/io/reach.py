"""Telling, within a second or two, that a store cannot be reached at all, and why.

Clients retry for long what cannot succeed: gcsfs retries a failed DNS lookup six times over
~30 s (printing a traceback at the end) and, with no credentials anywhere, spends ~16 s
asking a metadata server that does not exist before falling back to anonymous access. None
of these are worth waiting for: no network, a name that does not resolve, a port where
nothing listens, or no credentials. This module finds them out up front:

- `probe(endpoint)`: resolve the endpoint's host and open a TCP connection to it. A definite
  answer (no such host, connection refused, network unreachable) is the cause; a slow one is
  inconclusive (the client's own deadline then applies). Skipped behind an HTTP proxy, where
  a direct connection proves nothing.
- `guarded(url, endpoint, coro)`: run a client call with the probe beside it; when the probe
  says the store is unreachable, the call is cancelled and one error names the URL and the
  cause (the probe costs one connection, off the critical path, once per backend).
- `gcs_credentials_found()`: whether Google credentials could exist here (the environment
  variable, gcloud's application-default file, a Google machine with a metadata server). If
  none can, gs:// goes anonymous at once (what gcsfs ends up with after its search), and a
  refusal (401/403) says that no credentials were found.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import StoreUnavailableError
from ..urls import redact

__all__ = ["NO_CREDENTIALS", "gcs_credentials_found", "guarded", "probe"]

T = TypeVar("T")

NO_CREDENTIALS = ("no Google Cloud credentials were found, so the request went anonymous: "
                  "run `gcloud auth application-default login`, set "
                  "GOOGLE_APPLICATION_CREDENTIALS, or pass storage_options={'token': ...}")

_PROXY_VARS = ("https_proxy", "http_proxy", "all_proxy")


def _behind_proxy() -> bool:
    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARS)


async def probe(endpoint: str, timeout: float = 2.0) -> str | None:
    """Why `endpoint` (an http(s) URL) cannot be reached, or None when it can or the answer
    is not definite (slow DNS or connect, a proxy)."""
    parts = urlsplit(endpoint)
    host = parts.hostname
    if not host or _behind_proxy():
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
    except socket.gaierror as exc:
        return (f"cannot resolve host {host!r} ({exc.strerror}): no network, or a DNS "
                "failure")
    except (asyncio.TimeoutError, OSError):
        return None
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except ConnectionRefusedError:
        return (f"connection to {host}:{port} refused: nothing listens there (is the "
                "endpoint, e.g. STORAGE_EMULATOR_HOST or endpoint_url, right and running?)")
    except asyncio.TimeoutError:
        return None
    except OSError as exc:  # network or host unreachable, ...
        return f"cannot connect to {host}:{port} ({exc.strerror or exc}): no network?"
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return None


async def guarded(url: str, endpoint: str, call: Awaitable[T]) -> T:
    """`await call`, unless `probe(endpoint)` finds the store unreachable first: then the
    call is cancelled and `StoreUnavailableError` names `url` and the cause."""
    task: asyncio.Future[T] = asyncio.ensure_future(call)
    check = asyncio.ensure_future(probe(endpoint))
    try:
        await asyncio.wait({task, check},  # type: ignore[type-var]  # two result types
                           return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            cause = check.result()
            if cause is not None:
                raise StoreUnavailableError(f"{redact(url)}: {cause}")
        return await task
    finally:
        for t in (task, check):
            if not t.done():
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t


def _gcloud_dir() -> Path:
    config = os.environ.get("CLOUDSDK_CONFIG")
    if config:
        return Path(config)
    if os.name == "nt":
        return Path(os.environ.get("APPDATA", "")) / "gcloud"
    return Path.home() / ".config" / "gcloud"


def _on_google_machine() -> bool:
    """GCE, GKE, Cloud Run, ...: a metadata server that gives credentials may answer."""
    if any(os.environ.get(v) for v in ("GCE_METADATA_HOST", "GCE_METADATA_IP", "K_SERVICE",
                                       "CLOUD_RUN_JOB", "KUBERNETES_SERVICE_HOST")):
        return True
    try:
        return "Google" in Path("/sys/class/dmi/id/product_name").read_text()
    except OSError:
        return False


def gcs_credentials_found(options: dict[str, Any] | None = None) -> bool:
    """Whether gcsfs's search for credentials (token=None) could find any here; False means
    it would end, after ~16 s without a metadata server, anonymous."""
    if options and options.get("token") is not None:
        return True
    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return True
    gcloud = _gcloud_dir()
    if (gcloud / "application_default_credentials.json").exists():
        return True
    if (Path.home() / ".gcs_tokens").exists():  # gcsfs's own token cache
        return True
    return _on_google_machine()
