"""Async byte-range reads from local files, gs:// buckets and any fsspec filesystem.

One `Storage` serves every file of a pipeline, so its limits are global: at most
`concurrency` requests in flight and at most `max_inflight_bytes` being fetched. Each read
names its exact range (no hidden size lookups), transient failures (408, 429, 5xx, resets,
silence) are retried with jittered exponential backoff under a per-read deadline, a slow
request is hedged, and a read that cannot succeed raises `StorageError` naming the URL, range,
attempts and last cause.

How each kind of store performs one attempt is in `backends` (gs://: `gcs_client`); which
store serves a URL, per event loop, is `stores`'s (so the same `Storage` works from the
caller's loop and from the sync API's background loop); how a read is retried, given up on and
hedged is in `retry`. This module is what sits on top: the read paths, limits and I/O stats.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ObjectChangedError, StorageError, StoreUnavailableError
from ..options import GCS_CLIENTS
from ..urls import has_glob, is_local, redact
from .backends import Backend, LocalBackend, ObjectInfo
from .gcs.client import gcs_backend, gcs_client_for
from .retry import GaveUp, Retrier, RetryPolicy
from .shortread import short_read_error
from .stores import Stores

CACHED_READ_MAX = 1 << 16  # local reads up to this size try the page cache first (`read_many`)

__all__ = ["GCS_CLIENTS", "IOStats", "ObjectChangedError", "ObjectInfo", "RetryPolicy", "Storage",
           "StorageError", "StoreUnavailableError", "gcs_backend", "gcs_client_for", "has_glob",
           "is_local", "redact"]


@dataclass
class IOStats:
    """Counters for the I/O stage; read them any time, they only grow (but in_flight)."""

    requests: int = 0  # requests sent: attempts and hedges
    reads: int = 0  # reads completed
    bytes: int = 0
    retries: int = 0
    failures: int = 0
    hedges: int = 0  # duplicate requests sent for reads slow to answer
    hedge_wins: int = 0  # of them, those that finished first
    in_flight: int = 0
    peak_in_flight: int = 0
    busy_seconds: float = 0.0  # summed request latency
    statuses: dict[str, int] = field(default_factory=dict)  # transient causes seen

    def as_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}


async def _prepared(backend: Backend) -> None:
    """Let `backend` load its client first (gs:// on libcurl imports gcsfs for metadata
    calls: 1-8 s on a loaded machine), so that the deadline times the store, not imports."""
    prepare = getattr(backend, "prepare", None)
    if prepare is not None:
        await prepare()


class Storage:
    """Byte ranges of local files and fsspec URLs under one concurrency and byte budget."""

    def __init__(
        self,
        *,
        concurrency: int = 64,
        max_inflight_bytes: int = 256 << 20,
        retry: RetryPolicy | None = None,
        storage_options: Mapping[str, Any] | None = None,
        seed: int | None = None,
        gcs_client: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.max_inflight_bytes = max_inflight_bytes
        self.retry = retry or RetryPolicy()
        self.storage_options = dict(storage_options or {})
        self.stats = IOStats()
        self.stores = Stores(concurrency=concurrency, max_inflight_bytes=max_inflight_bytes,
                             retry=self.retry, storage_options=self.storage_options,
                             gcs_client=gcs_client)
        self._retrier = Retrier(self.retry, self.stats, random.Random(seed))

    @property
    def limit(self) -> int:
        """Requests in flight now (at most `concurrency`: see `set_concurrency`)."""
        return self.stores.limit

    def set_concurrency(self, n: int) -> None:
        """Allow `n` requests in flight from now on, up to the `concurrency` the storage was
        made with (its clients' connection pools are sized for that); the autotuner's knob."""
        self.stores.set_limit(n)

    def base_rtt(self) -> float | None:
        """The least median time to an answer so far (None: too few requests): the autotuner's
        floor for the time a read takes."""
        return None if self._retrier.base_rtt == float("inf") else self._retrier.base_rtt

    def slots_held_seconds(self) -> float:
        """Request-seconds spent in flight so far, over all loops (see `Gate`)."""
        return self.stores.held_seconds()

    # -- public -----------------------------------------------------------------------

    def pin(self, info: ObjectInfo) -> None:
        """Read this object at the version it had when listed (gs:// generations); a later
        rewrite then fails loudly with `ObjectChangedError` instead of mixing versions."""
        self.stores.pin(info)

    async def _bounded(self, what: str, url: str, coro: Any) -> Any:
        """Metadata calls go through the client's own retries; bound them by our deadline."""
        try:
            return await asyncio.wait_for(coro, self.retry.deadline)
        except StoreUnavailableError:  # a TimeoutError too, but one that says why already
            raise
        except asyncio.TimeoutError:
            raise StoreUnavailableError(
                f"{redact(url)}: {what} got no answer within {self.retry.deadline:g} s (the "
                "store is unavailable; if it is only slow, or the listing very large, raise "
                "RetryPolicy's deadline)") from None

    async def info(self, url: str) -> ObjectInfo:
        backend, path = self.stores.route(url)
        await _prepared(backend)
        try:
            return await self._bounded("looking up its size", url, backend.info(path))
        except FileNotFoundError:
            raise FileNotFoundError(f"{redact(url)}: no such file or object") from None

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        """Files matching `pattern`, sorted by URL, with their sizes (one listing)."""
        backend, path = self.stores.route(pattern)
        await _prepared(backend)
        return await self._bounded("listing", pattern, backend.glob(path))

    async def read(self, url: str, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of `url`, retried on transient failures."""
        n = end - start
        if n <= 0:
            return b""
        self.check_budget(url, start, end)
        backend, path = self.stores.route(url)
        args = (path, start, end)
        data = await self._attempts(url, n, (start, end), backend, backend.read, args,
                                    (backend.read, args, None))
        if len(data) != n:
            self.stats.failures += 1
            raise short_read_error(url, start, end, len(data))
        self.stats.reads += 1
        self.stats.bytes += n
        return data

    async def read_into(self, url: str, start: int, end: int, dest: memoryview) -> None:
        """`read`, written into `dest` (`end - start` bytes long): by stores that can, as the
        bytes arrive (gs://); by the others, as one copy of what `read` returns."""
        backend, path = self.stores.route(url)
        into = getattr(backend, "read_into", None)
        if into is None or end <= start:
            dest[: end - start] = await self.read(url, start, end)
            return
        self.check_budget(url, start, end)
        n = end - start

        def land(data: bytes) -> None:  # a hedge read its own buffer: its bytes go in place
            dest[:n] = data

        await self._attempts(url, n, (start, end), backend, into, (path, start, end, dest),
                             (backend.read, (path, start, end), land))
        self.stats.reads += 1
        self.stats.bytes += end - start

    async def read_tail(self, url: str, n: int) -> tuple[ObjectInfo, bytes | None]:
        """`url`'s size and version, and its last `min(n, size)` bytes when the store gives
        all of that in one request (gs://: a suffix-range GET), else None for the bytes.

        This is how a file named without a glob is opened in one round trip instead of a
        metadata lookup (~3 requests on gcsfs) then a tail read. The GET is retried, counted
        and budgeted like any read; 404 is the same `FileNotFoundError` as `info()`'s.
        """
        backend, path = self.stores.route(url)
        read_tail = getattr(backend, "read_tail", None)
        if read_tail is None:
            return await self.info(url), None
        n = min(n, self.max_inflight_bytes)
        try:
            tail = await self._attempts(url, n, None, backend, read_tail, (path, n),
                                        (read_tail, (path, n), None))
        except ObjectChangedError:
            raise
        except FileNotFoundError:
            raise FileNotFoundError(f"{redact(url)}: no such file or object") from None
        if tail is None:  # empty object (416), or no generation header: ask the metadata
            return await self.info(url), None
        self.stats.reads += 1
        self.stats.bytes += len(tail.data)
        return tail.info, tail.data

    async def _attempts(self, url: str, n: int, span: tuple[int, int] | None,
                        backend: Backend, call: Callable[..., Awaitable[Any]], args: tuple,
                        hedge: tuple | None) -> Any:
        """`await call(*args)` (one backend request) under the retry policy (`retry`), holding
        `n` bytes of budget, and a concurrency slot per attempt; `hedge` is the duplicate to
        send when a request is slow to answer. `span` is the byte range for error messages
        (None: the last `n` bytes)."""
        state = self.stores.state()
        if not state.budget.take(n):
            await state.budget.acquire(n)
        try:
            return await self._retrier.run(state.slots, call, args, hedge=hedge,
                                           streams=backend.streams, url=url, span=span)
        except ObjectChangedError:
            raise
        except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
            where = f" [{span[0]}, {span[1]})" if span else ""
            raise type(exc)(redact(f"{url}{where}: {exc}")) from None
        except GaveUp as exc:
            raise _unavailable(url, n, span, exc, self.retry) from None
        finally:
            state.budget.release(n)

    def check_budget(self, url: str, start: int, end: int) -> None:
        """Refuse a read that could never fit the byte budget (it would wait forever)."""
        if end - start > self.max_inflight_bytes:
            raise StorageError(
                f"{redact(url)}: one read of bytes [{start}, {end}) ({end - start:,} bytes) is "
                f"larger than the memory budget ({self.max_inflight_bytes:,} bytes); raise "
                "memory_budget, or rewrite the file in smaller chunks (an ArrayRecord "
                "file: a smaller group_size; a TFRecord file: smaller records)"
            )

    async def read_many(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Several reads at once, results in request order.

        Local reads go in batched thread-pool jobs (a thread hop costs more than a
        page-cache pread): small ones the page cache holds all in one job first (threads
        would only take turns at the interpreter), then the rest, which may wait for a
        disk, spread over a few; remote reads each get their own request, all in flight at
        once.
        """
        local = [k for k, (url, _, _) in enumerate(requests) if is_local(url)]
        if len(local) < 2:
            return list(await asyncio.gather(*(self.read(u, s, e) for u, s, e in requests)))
        remote = [k for k, (url, _, _) in enumerate(requests) if not is_local(url)]
        out: list[bytes] = [b""] * len(requests)
        small = [k for k in local if requests[k][2] - requests[k][1] <= CACHED_READ_MAX]
        if len(small) > 1:
            hit: set[int] = set()
            for part in self._within_budget(small, requests):  # (one job at a time)
                got = await self._read_local([requests[k] for k in part], cached=True)
                for k, data in zip(part, got):
                    if data is not None:
                        out[k] = data
                        hit.add(k)
            local = [k for k in local if k not in hit]
        groups = max(1, min(self.concurrency, 32, len(local) // 16))
        jobs = [local[g::groups] for g in range(groups)]

        async def local_job(ks: list[int]) -> None:
            for k, data in zip(ks, await self._read_local([requests[k] for k in ks])):
                out[k] = data

        async def remote_one(k: int) -> None:
            out[k] = await self.read(*requests[k])

        await asyncio.gather(*(local_job(ks) for ks in jobs), *(remote_one(k) for k in remote))
        return out

    def _within_budget(self, keys: list[int], requests: Sequence[tuple[str, int, int]]
                       ) -> list[list[int]]:
        """`keys` in runs whose reads take at most half the byte budget together."""
        parts: list[list[int]] = [[]]
        total, most = 0, max(1, self.max_inflight_bytes // 2)
        for k in keys:
            n = requests[k][2] - requests[k][1]
            if parts[-1] and total + n > most:
                parts.append([])
                total = 0
            parts[-1].append(k)
            total += n
        return parts

    async def _read_local(self, items: Sequence[tuple[str, int, int]], cached: bool = False
                          ) -> list[Any]:
        """`items` read by the local backend, in one job; with `cached`, only those the
        page cache holds whole (None for the others, not counted as read)."""
        backend, _ = self.stores.route("file://")
        assert isinstance(backend, LocalBackend)
        for u, s, e in items:
            self.check_budget(u, s, e)
        paths = [(u.removeprefix("file://"), s, e) for u, s, e in items]
        total = sum(e - s for _, s, e in paths)
        state, stats = self.stores.state(), self.stats
        await state.budget.acquire(total)
        try:
            async with state.slots:
                if not cached:  # (cached: those it read, below)
                    stats.requests += len(paths)
                t0 = time.monotonic()
                try:
                    datas: list[Any] = await (backend.read_cached(paths) if cached else
                                              backend.read_batch(paths))
                except FileNotFoundError as exc:
                    stats.failures += 1
                    if isinstance(exc, ObjectChangedError):  # (it names the file)
                        raise
                    raise FileNotFoundError(f"{exc.filename}: no such file") from None
                finally:
                    stats.busy_seconds += time.monotonic() - t0
            done = [(item, data) for item, data in zip(items, datas) if data is not None]
            if cached:
                stats.requests += len(done)
            for (url, start, end), data in done:
                if len(data) != end - start:
                    stats.failures += 1
                    raise short_read_error(url, start, end, len(data))
            stats.reads += len(done)
            stats.bytes += sum(len(data) for _, data in done)
            return datas
        finally:
            state.budget.release(total)

    async def aclose(self) -> None:
        """Release this loop's sessions, descriptors and threads."""
        await self.stores.aclose()


def _unavailable(url: str, n: int, span: tuple[int, int] | None, exc: GaveUp,
                 policy: RetryPolicy) -> StoreUnavailableError:
    """The error for a read the retry policy gave up on: what was read, how often and how
    long it was tried, the last cause, and what to change."""
    what = f"reading bytes [{span[0]}, {span[1]})" if span else f"reading its last {n} bytes"
    tries = f"{exc.attempts} attempt{'s' if exc.attempts > 1 else ''}"
    if exc.unreachable:
        return StoreUnavailableError(redact(
            f"{url}: {what} failed: could not connect ({exc.cause}; {tries} in "
            f"{exc.seconds:.1f} s): no network, a DNS failure, or nothing listening at the "
            "endpoint (check endpoint_url or STORAGE_EMULATOR_HOST if set)"))
    return StoreUnavailableError(redact(
        f"{url}: {what} failed after {tries} in {exc.seconds:.1f} s; last: {exc.cause} (the "
        "store is unavailable or overloaded: retry later, or if it is only slow, raise "
        f"RetryPolicy's deadline ({policy.deadline:g} s), timeout ({policy.timeout:g} s) or "
        f"attempts ({policy.attempts}))"))
