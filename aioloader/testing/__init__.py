"""A local GCS bucket for tests and benchmarks: fake-gcs-server plus a delay-line proxy.

This package owns the cloud stand-in that every cloud test and benchmark shares, so that all of
them reach a bucket the same way: over real HTTP, through gcsfs, with no mocks.

``local_gcs()`` starts the fake-gcs-server binary (:mod:`.server`), creates a bucket, points
gcsfs at it through environment variables and hands back a :class:`LocalGCS`. When latency,
jitter, a bandwidth cap or faults are asked for, clients talk to a *delay line* instead
(:mod:`.delayline`): an asyncio TCP proxy on a background thread, or with ``proxy_process=True``
in a child process (for benchmarks, where a thread would share the GIL with the client it
measures). Nothing is left behind on exit: proxy stopped, server terminated, temp dir removed,
with an ``atexit`` guard and a watchdog process for the unclean exits.

Modules: ``__init__`` the public API (this file); ``server`` the fake-gcs-server process;
``delayline`` the proxy (``faults`` its request framing and fault
decisions, ``forward`` the forwarding of one connection).

Importing this package changes no global state (a user's test suite imports it). gcsfs
imported with ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` on (its default) exports a
``gcsfs.GCSFileSystem`` that probes a gRPC API and stalls every call against an emulator for
30-50 s, so aioloader's gs:// reads and :meth:`LocalGCS.fs` build ``gcsfs.core.GCSFileSystem``
whenever an emulator is set; ``local_gcs()`` also sets the variable to ``false`` inside its
``with`` (for gcsfs imported there, e.g. by ``fsspec.open("gs://...")``). gcsfs is imported
lazily, so this package imports without it. Needs the ``testing`` extra
(``pip install 'aioloader[testing]'``).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .delayline import _HOST, ProxyStats, _DelayLine, _DelayLineProcess, _Faults
from .server import _Server, find_fake_gcs_server

__all__ = ["LocalGCS", "ProxyStats", "find_fake_gcs_server", "local_gcs"]

DEFAULT_BUCKET = "aioloader-test"


class LocalGCS:
    """A running local bucket. Get one from :func:`local_gcs`."""

    def __init__(
        self, server: _Server, proxy: _DelayLine | _DelayLineProcess | None, bucket: str
    ) -> None:
        self._server = server
        self._proxy = proxy
        self.bucket = bucket

    @property
    def server_endpoint(self) -> str:
        """The fake-gcs-server URL, bypassing the delay line."""
        return self._server.endpoint

    @property
    def endpoint(self) -> str:
        """The URL clients should use: the delay line's when there is one, else the server's."""
        return f"http://{_HOST}:{self._proxy.port}" if self._proxy else self.server_endpoint

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for ``fsspec.filesystem("gs", **opts)`` / ``gcsfs.GCSFileSystem(**opts)``."""
        return {"token": "anon", "endpoint_url": self.endpoint}

    @property
    def log_path(self) -> Path:
        """fake-gcs-server's log file (removed on exit)."""
        return self._server.log_path

    def url(self, name: str) -> str:
        """``gs://bucket/name``."""
        return f"gs://{self.bucket}/{name}"

    def fs(self, **kw: Any) -> Any:
        """A new sync ``gcsfs`` filesystem pointed at :attr:`endpoint` (``kw`` override)."""
        from gcsfs.core import GCSFileSystem  # the plain class, whatever gcsfs exports

        return GCSFileSystem(**{**self.storage_options, "skip_instance_cache": True, **kw})

    # -- objects, over plain HTTP straight to the server --------------------------------------

    def upload(self, local_path: str | os.PathLike[str], name: str) -> str:
        """Upload a local file (streamed) as object ``name``; return its ``gs://`` URL."""
        size = os.path.getsize(local_path)
        with open(local_path, "rb") as f:
            return self._upload(f, size, name)

    def upload_bytes(self, data: bytes, name: str) -> str:
        """Upload ``data`` as object ``name``; return its ``gs://`` URL."""
        return self._upload(data, len(data), name)

    def _upload(self, body: Any, size: int, name: str) -> str:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._request(
            "POST", f"/upload/storage/v1/b/{_q(self.bucket)}/o?{query}", body,
            {"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        return self.url(name)

    def delete(self, name: str) -> None:
        """Delete object ``name`` (a missing object raises ``FileNotFoundError``)."""
        self._request("DELETE", f"/storage/v1/b/{_q(self.bucket)}/o/{_q(name)}")

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        """Object names under ``prefix`` and their sizes."""
        out: dict[str, int] = {}
        token = ""
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            path = f"/storage/v1/b/{_q(self.bucket)}/o?{urllib.parse.urlencode(query)}"
            page = json.loads(self._request("GET", path) or b"{}")
            out.update({o["name"]: int(o["size"]) for o in page.get("items", [])})
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def create_bucket(self, name: str) -> None:
        """Create another bucket (an existing one is fine)."""
        body = json.dumps({"name": name}).encode()
        with contextlib.suppress(FileExistsError):
            self._request("POST", "/storage/v1/b?project=test", body,
                          {"Content-Type": "application/json"})

    def _request(
        self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> bytes:
        req = urllib.request.Request(
            self.server_endpoint + path, data=body, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            msg = f"{method} {path} -> HTTP {e.code}: {detail}"
            if e.code == 404:
                raise FileNotFoundError(msg) from None
            if e.code == 409:
                raise FileExistsError(msg) from None
            raise RuntimeError(msg) from None

    # -- the delay line ----------------------------------------------------------------------

    def set_faults(
        self,
        error_rate: float = 0.0,
        statuses: Sequence[int] = (503, 429),
        stall: bool = False,
        *,
        reset_rate: float = 0.0,
        slow_rate: float = 0.0,
        slow_s: float = 1.0,
        cut_rate: float = 0.0,
        hold_s: float = 0.0,
        hold_at: str = "head",
        hold_rate: float = 0.0,
        hold_first: int = 0,
        error_first: int = 0,
        reset_first: int = 0,
        error_body: str = "",
    ) -> None:
        """Change fault injection now, for requests that arrive from here on (replaces all).

        ``error_rate``: fraction of requests the proxy answers itself with one of ``statuses``
        (body ``error_body``, empty by default; connection kept alive); ``error_first``: the
        first k downloads (range GETs) from now are answered so too, whatever the rate.
        ``reset_rate``: fraction of requests whose connection the proxy resets instead (RST,
        nothing written: the client sees a connection reset or a server disconnect);
        ``reset_first``: the first k downloads from now too. ``slow_rate``: fraction of the
        forwarded requests whose response body is held back ``slow_s`` seconds after the
        response head (the slow-body tail). ``cut_rate``: fraction of the forwarded requests
        whose response is cut off mid-body (the head and half the body bytes at hand, then a
        reset). ``stall``: accept connections and requests but never answer them — a bucket that
        stops answering; connections that stalled stay silent. ``hold_first`` (the first k
        downloads from now) and ``hold_rate`` (a fraction of the others): range GETs whose
        response is held ``hold_s`` seconds (``math.inf``: until the client gives up) — before
        its head (``hold_at="head"``), or after its head and half the body bytes at hand
        (``hold_at="body"``); a held request stalls, then goes on. Each request gets at most one
        fault (stall, then reset, then error status, then hold, then slow body, then cut body),
        chosen by the seeded RNG.
        Counters: :attr:`proxy_stats` ``faults``, ``resets``, ``slowed``, ``cut``,
        ``stalled``, ``held``.
        """
        if self._proxy is None:
            raise RuntimeError(
                "this local_gcs() has no delay line; start it with proxy=True (or with "
                "latency/jitter/bandwidth or a fault rate) to control faults"
            )
        for name, rate in (("error_rate", error_rate), ("reset_rate", reset_rate),
                           ("slow_rate", slow_rate), ("cut_rate", cut_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if (error_rate > 0 or error_first > 0) and not statuses:
            raise ValueError("statuses must not be empty when error_rate or error_first > 0")
        if min(slow_s, hold_s, hold_first, error_first, reset_first) < 0:
            raise ValueError("slow_s, hold_s, hold_first, error_first and reset_first must "
                             "be >= 0")
        if not 0.0 <= hold_rate <= 1.0:
            raise ValueError(f"hold_rate must be in [0, 1], got {hold_rate}")
        if hold_at not in ("head", "body"):
            raise ValueError(f"hold_at must be 'head' or 'body', got {hold_at!r}")
        self._proxy.faults = _Faults(
            float(error_rate), tuple(int(s) for s in statuses), bool(stall),
            reset_rate=float(reset_rate), slow_rate=float(slow_rate), slow_s=float(slow_s),
            cut_rate=float(cut_rate), hold_s=float(hold_s), hold_at=hold_at,
            hold_rate=float(hold_rate), hold_first=int(hold_first),
            error_first=int(error_first), reset_first=int(reset_first), error_body=str(error_body),
        )

    @property
    def proxy_stats(self) -> ProxyStats:
        """Counters of the delay line (all zero without one)."""
        return self._proxy.stats if self._proxy is not None else ProxyStats()


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


@contextlib.contextmanager
def local_gcs(
    latency_ms: float = 0.0,
    jitter_ms: float = 0.0,
    error_rate: float = 0.0,
    bandwidth_bytes_per_s: float | None = None,
    root: str | os.PathLike[str] | None = None,
    *,
    bucket: str = DEFAULT_BUCKET,
    proxy: bool | None = None,
    proxy_process: bool = False,
    seed: int = 0,
    reset_rate: float = 0.0,
    slow_rate: float = 0.0,
    slow_s: float = 1.0,
) -> Iterator[LocalGCS]:
    """Run a local GCS bucket for the duration of the ``with`` block.

    ``latency_ms`` (+ exponential ``jitter_ms``) delays every request; ``bandwidth_bytes_per_s``
    caps each connection's download; ``error_rate`` answers that fraction of requests with
    503/429, ``reset_rate`` resets that fraction's connections, ``slow_rate`` holds that
    fraction of response bodies ``slow_s`` seconds (see :meth:`LocalGCS.set_faults`).
    Any of them (or ``proxy=True``) puts the delay line in front of the server, on a
    background thread, or with ``proxy_process=True`` in a child process (use that for
    benchmarks: in a thread the proxy competes with the client for the GIL).
    ``root=DIR`` keeps objects on disk in ``DIR`` between runs (default: in memory). ``seed``
    fixes jitter and fault choices. Sets ``STORAGE_EMULATOR_HOST`` (gcsfs, google-cloud-storage)
    and ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` (array_record's C++ client) to :attr:`LocalGCS.endpoint`
    and restores them on exit.
    """
    proxy = _wants_proxy(proxy, proxy_process, latency_ms, jitter_ms, bandwidth_bytes_per_s,
                         error_rate, reset_rate, slow_rate)
    server = _Server(root)
    delay_line: _DelayLine | _DelayLineProcess | None = None
    try:
        server.start()
        gcs = LocalGCS(server, None, bucket)
        gcs.create_bucket(bucket)
        if proxy:
            args = (server.port, latency_ms / 1e3, jitter_ms / 1e3, bandwidth_bytes_per_s,
                    _Faults(), seed)
            delay_line = (
                _DelayLineProcess(*args, log_path=server.tmpdir / "delay-line.log")
                if proxy_process else _DelayLine(*args)
            )
            delay_line.start()
            gcs._proxy = delay_line
            gcs.set_faults(error_rate=error_rate, reset_rate=reset_rate, slow_rate=slow_rate,
                           slow_s=slow_s)
        with _environ({
            "STORAGE_EMULATOR_HOST": gcs.endpoint,
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs.endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }):
            yield gcs
    finally:
        try:
            if delay_line is not None:
                delay_line.stop()
        finally:
            server.stop()


def _wants_proxy(proxy: bool | None, proxy_process: bool, latency_ms: float, jitter_ms: float,
                 bandwidth: float | None, *rates: float) -> bool:
    """Whether `local_gcs` puts the delay line in front (asked, or anything for it to do);
    a negative delay or a bandwidth that is not positive is refused."""
    if latency_ms < 0 or jitter_ms < 0:
        raise ValueError("latency_ms and jitter_ms must be >= 0")
    if bandwidth is not None and bandwidth <= 0:
        raise ValueError("bandwidth_bytes_per_s must be > 0 or None")
    if proxy is None:
        proxy = bool(latency_ms or jitter_ms or any(rates) or bandwidth)
    return proxy or proxy_process


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """These environment variables set for the ``with`` block, as they were after it."""
    saved: dict[str, str | None] = {}
    try:
        for key, value in values.items():
            saved[key] = os.environ.get(key)
            os.environ[key] = value
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
