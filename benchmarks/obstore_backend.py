"""A throwaway gs:// backend on obstore (Rust object_store), for benchmarks only.

`install()` makes every new `Storage` read gs:// through `ObstoreGCSBackend` instead of
libcurl, in this process only (workers=0 runs). Listing and metadata stay gcsfs's, as in the
libcurl backend; reads, pinned reads and the open's suffix GET go through one `GCSStore` per
bucket with object_store's own retries off (aioloader's retry layer, silence timing and
hedging stay in charge). Behind the delay line, set OBSTORE_GCS_HOST to the emulator's own
host:port: object_store uses the XML API path (/bucket/object), which fake-gcs-server serves
only when the Host header is its public host (else it takes the host for a bucket's virtual
host and answers 404). Progress is told coarsely: the head when `get_async` returns, the
body when it is complete (no per-chunk progress for small reads). Needs `pip install
obstore`; not part of the package.
"""
from __future__ import annotations

import os
from typing import Any

import obstore
from obstore.exceptions import NotFoundError
from obstore.store import GCSStore

from aioloader.errors import ObjectChangedError, Transient
from aioloader.io.backends import ObjectInfo, Tail
from aioloader.io.gcs.backend import CurlGCSBackend
from aioloader.io.gcs.store import GcsStore

MADE = 0  # backends made in this process (benchmarks check which client served them)


class ObstoreGCSBackend(CurlGCSBackend):
    streams = True

    def __init__(self, options: dict[str, Any], connections: int,
                 pins: dict[str, str]) -> None:
        # (CurlGCSBackend's metadata paths, without its libcurl session)
        global MADE
        MADE += 1
        GcsStore.__init__(self, options, pins, lazy=True)
        self._urls: dict = {}
        self._stores: dict[str, GCSStore] = {}
        if not self._anon:
            raise NotImplementedError("benchmark backend: anonymous emulator access only")

    def _store(self, path: str) -> tuple[GCSStore, str]:
        bucket, _, name = self._key(path)[5:].partition("/")
        st = self._stores.get(bucket)
        if st is None:
            client: Any = {"allow_http": True, "pool_max_idle_per_host": "1024"}
            if os.environ.get("OBSTORE_GCS_HOST"):
                client["default_headers"] = {"host": os.environ["OBSTORE_GCS_HOST"]}
            st = self._stores[bucket] = GCSStore(
                bucket, base_url=self._base, skip_signature=True, client_options=client,
                retry_config={"max_retries": 0})
        return st, name

    async def _get(self, path: str, start: int, end: int, dest: memoryview | None,
                   watch: Any) -> Any:
        st, name = self._store(path)
        generation = self.pins.get(self._key(path)) or None
        options: dict[str, Any] = {"range": (start, end)}
        if generation:
            options["version"] = generation
        try:
            r = await obstore.get_async(st, name, options=options)  # type: ignore[arg-type]
            if watch is not None:
                watch.answered()
            body = await r.bytes_async()
        except NotFoundError:
            if generation:
                raise ObjectChangedError(f"{self._key(path)}: generation {generation} is gone"
                                         ) from None
            raise FileNotFoundError(self._key(path)) from None
        except Exception as exc:  # (benchmark: anything else counts as worth retrying)
            raise Transient(f"{type(exc).__name__}") from None
        if len(body) != end - start:
            raise Transient(f"short body ({len(body)} of {end - start} bytes)")
        if dest is None:
            return bytes(body)
        dest[: end - start] = memoryview(body)
        return None

    async def read_tail(self, path: str, n: int, watch: Any = None) -> Tail | None:
        st, name = self._store(path)
        try:
            r = await obstore.get_async(st, name, options={"range": {"suffix": n}})
            if watch is not None:
                watch.answered()
            body = await r.bytes_async()
        except NotFoundError:
            raise FileNotFoundError(self._key(path)) from None
        meta = r.meta
        version = meta.get("version")
        if not version:
            return None
        return Tail(ObjectInfo(self._key(path), int(meta["size"]), str(version)), bytes(body))

    async def aclose(self) -> None:
        await GcsStore.aclose(self)


def install() -> None:
    """Make new `Storage` objects in this process read gs:// through obstore."""
    import aioloader.io.stores as stores

    stores.gcs_backend = (  # type: ignore[assignment]
        lambda client, options, connections, pins, **kw: ObstoreGCSBackend(
            options, connections, pins))
