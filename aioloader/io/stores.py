"""Which store serves each URL of a `Storage`, per event loop.

Stores hold sessions, and sessions belong to the loop they were made on: one `LoopState` per
loop (`loopstate`) keeps its request slots, byte budget and stores (one per scheme), closed
on their loop when left open. A URL's route (its store and its path there) is worked out
once; gs:// stores read at the generations pinned here. The read paths, retries and stats on
top are `storage.Storage`'s.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

from ..logs import logger
from ..options import RetryPolicy, gcs_client_named
from ..urls import GCS_SCHEMES, is_local
from .backends import Backend, FsspecBackend, LocalBackend, ObjectInfo
from .gcs.client import gcs_backend
from .loopstate import ROUTES_KEPT, LoopState, close_left_open

__all__ = ["Stores"]

log = logger("storage")


class Stores:
    """The stores of one `Storage`, per event loop, and the route of each URL to one."""

    def __init__(self, *, concurrency: int, max_inflight_bytes: int, retry: RetryPolicy,
                 storage_options: dict[str, Any], gcs_client: str | None) -> None:
        env = os.environ.get("AIOLOADER_GCS_CLIENT")
        self.gcs_client = gcs_client_named(
            gcs_client or env or "auto",
            "gcs_client" if gcs_client or not env else "AIOLOADER_GCS_CLIENT")
        self.concurrency = concurrency
        self.max_inflight_bytes = max_inflight_bytes
        self.retry = retry
        self.storage_options = storage_options
        self.pins: dict[str, str] = {}  # gs:// URL -> the generation its reads are pinned to
        self.limit = concurrency  # requests in flight now (<= concurrency: `set_limit`)
        self._states: dict[asyncio.AbstractEventLoop, LoopState] = {}
        self._finalizers: dict[asyncio.AbstractEventLoop, weakref.finalize] = {}

    def set_limit(self, n: int) -> None:
        """Allow `n` requests in flight on every loop from now on (at most `concurrency`)."""
        self.limit = max(1, min(self.concurrency, int(n)))
        for state in self._states.values():
            state.slots.resize(self.limit)

    def held_seconds(self) -> float:
        """Request-seconds spent in flight so far, over all loops (see `Gate`)."""
        return sum(state.slots.held_seconds() for state in self._states.values())

    def state(self) -> LoopState:
        """This loop's slots, budget and stores (made on first use)."""
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = LoopState(self.limit, self.max_inflight_bytes)
            self._finalizers[loop] = weakref.finalize(self, close_left_open, loop, state,
                                                       os.getpid())
        return state

    def route(self, url: str) -> tuple[Backend, str]:
        """The store that serves `url` on this loop, and `url`'s path there."""
        state = self.state()
        route = state.routes.get(url)  # (every range read asks: worked out once per URL)
        if route is not None:
            return route
        if is_local(url):
            key, path = "file", url.removeprefix("file://")
        else:
            key, _, _ = url.partition("://")
            path = url
        backend = state.backends.get(key)
        if backend is None:
            backend = state.backends[key] = self._make(key)
            log.debug("%s reads through %s, %d in flight at most, retries: %s", key,
                      type(backend).__name__, self.concurrency, self.retry)
        route = (backend, path)
        if len(state.routes) < ROUTES_KEPT:
            state.routes[url] = route
        return route

    def _make(self, key: str) -> Backend:
        if key == "file":
            return LocalBackend(min(32, self.concurrency))
        if key in GCS_SCHEMES:
            return gcs_backend(self.gcs_client, self.storage_options,
                               self.concurrency + self.retry.max_hedges, self.pins,
                               silence=self.retry.timeout)
        return FsspecBackend(key, self.storage_options)

    def pin(self, info: ObjectInfo) -> None:
        """Read this object at the version it had when listed (gs:// generations)."""
        if not is_local(info.url) and info.version:
            self.pins[info.url] = info.version

    async def aclose(self) -> None:
        """Close this loop's stores (sessions, descriptors, threads)."""
        loop = asyncio.get_running_loop()
        state = self._states.pop(loop, None)
        finalizer = self._finalizers.pop(loop, None)
        if finalizer is not None:
            finalizer.detach()
        if state is not None:
            for backend in state.backends.values():
                await backend.aclose()
