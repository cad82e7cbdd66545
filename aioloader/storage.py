"""Async byte-range reads from local files, gs:// buckets and any fsspec filesystem.

One `Storage` serves every file of a pipeline, so its limits are global: at most
`concurrency` requests in flight and at most `max_inflight_bytes` being fetched. Each read
names its exact range (no hidden size lookups), transient failures (408, 429, 5xx, resets,
timeouts) are retried with jittered exponential backoff under a per-request deadline, and a
read that cannot succeed raises `StorageError` naming the URL, range, attempts and last cause.

Backends:
- local paths: `os.pread` on a cached descriptor, in a thread pool we size ourselves;
- gs://: gcsfs for listing, metadata and credentials, but range GETs on our own aiohttp
  session. gcsfs wraps every request in its own retry loop (six tries, 1-32 s sleeps) that
  cannot be turned off per instance; reading through it would hide retries from our stats
  and stretch a 503 into seconds. Our session also lifts the 100-connection cap;
- any other fsspec filesystem: its async `_cat_file` when it has one, else threads.

Loop-bound resources (sessions, semaphores) are kept per event loop, so the same `Storage`
works from the caller's loop and from the background loop of the sync API.
"""

from __future__ import annotations

import asyncio
import glob as globlib
import os
import random
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_GLOB_CHARS = re.compile(r"[*?\[]")


class StorageError(OSError):
    """A range read or lookup that failed for good (after retries, or not retriable)."""


class ObjectChangedError(StorageError, FileNotFoundError):
    """A file or object was rewritten or deleted after it was opened."""


class StoreUnavailableError(StorageError, TimeoutError):
    """The store kept failing or did not answer within the retry policy's deadline."""


class ObjectInfo(NamedTuple):
    """What opening a file needs: its size, and a version that changes when it is rewritten."""

    url: str
    size: int
    version: str


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures are retried. Delays grow as base * 2^k with full jitter."""

    attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 2.0
    timeout: float = 30.0  # one attempt
    deadline: float = 120.0  # all attempts of one read

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))


@dataclass
class IOStats:
    """Counters for the I/O stage; read them any time, they only grow (but in_flight)."""

    requests: int = 0  # attempts issued
    reads: int = 0  # reads completed
    bytes: int = 0
    retries: int = 0
    failures: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    busy_seconds: float = 0.0  # summed request latency
    statuses: dict[str, int] = field(default_factory=dict)  # transient causes seen

    def as_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}


async def _within(coro: Any, seconds: float) -> Any:
    """`await coro`, or TimeoutError after `seconds`; on 3.11+ without wait_for's extra task."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await coro
    return await asyncio.wait_for(coro, seconds)  # pragma: no cover - Python 3.10


def redact(url: str) -> str:
    """Hide credentials embedded in a URL (`scheme://user:secret@host`)."""
    return re.sub(r"(://)[^/@]+@", r"\1***@", url)


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def has_glob(pattern: str) -> bool:
    return bool(_GLOB_CHARS.search(pattern))


class _Transient(Exception):
    """A failure worth retrying; `cause` is what the error message reports."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class _ByteBudget:
    """Waits until `n` more bytes fit under the budget (one oversized read may run alone).

    The uncontended path takes no lock and never yields: it runs once per range read.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: list[tuple[int, asyncio.Future]] = []

    def _fits(self, n: int) -> bool:
        return self.used == 0 or self.used + n <= self.limit

    async def acquire(self, n: int) -> None:
        if not self._waiters and self._fits(n):
            self.used += n
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.used -= n  # granted just as we were cancelled: give it back
                self._wake()
            else:
                self._waiters = [w for w in self._waiters if w[1] is not fut]
            raise

    def release(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, fut = self._waiters.pop(0)
            if not fut.done():
                self.used += n
                fut.set_result(None)


class _LocalBackend:
    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="aioloader-pread")
        self._fds: dict[str, int] = {}

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return fd

    async def info(self, path: str) -> ObjectInfo:
        st = await asyncio.get_running_loop().run_in_executor(self._pool, os.stat, path)
        return ObjectInfo(path, st.st_size, str(st.st_mtime_ns))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        paths = sorted(p for p in globlib.glob(pattern, recursive=True) if os.path.isfile(p))
        return list(await asyncio.gather(*(self.info(p) for p in paths)))

    async def read(self, path: str, start: int, end: int) -> bytes:
        fd = self._fd(path)
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, os.pread, fd, end - start, start
        )

    async def read_batch(self, items: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Several preads in one thread-pool job: one hop instead of one per range."""
        fds = [(self._fd(path), start, end) for path, start, end in items]
        return await asyncio.get_running_loop().run_in_executor(self._pool, _pread_all, fds)

    async def aclose(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._pool.shutdown(wait=True)


def _pread_all(items: list[tuple[int, int, int]]) -> list[bytes]:
    return [os.pread(fd, end - start, start) for fd, start, end in items]


class _GCSBackend:
    def __init__(self, options: dict[str, Any], concurrency: int, policy: RetryPolicy,
                 pins: dict[str, str]) -> None:
        self.pins = pins
        import aiohttp
        import gcsfs

        opts = dict(options)
        if os.environ.get("STORAGE_EMULATOR_HOST") and "token" not in opts:
            opts["token"] = "anon"  # emulators take no credentials
        self.fs = gcsfs.GCSFileSystem(asynchronous=True, skip_instance_cache=True,
                                      loop=asyncio.get_running_loop(), **opts)
        self._aiohttp = aiohttp
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=policy.timeout,
                                          sock_read=policy.timeout),
            auto_decompress=False,
        )
        # aiohttp silently re-sends an idempotent request once when its connection drops;
        # every retry must go through our RetryPolicy (backoff, deadline, stats) instead.
        if hasattr(self.session, "_retry_connection"):
            self.session._retry_connection = False

    @staticmethod
    def _key(path: str) -> str:
        return path if path.startswith("gs://") else "gs://" + path

    async def info(self, path: str) -> ObjectInfo:
        meta = await self.fs._info(path)
        if meta.get("type") == "directory":
            raise IsADirectoryError(path)
        return ObjectInfo(self._key(path), int(meta["size"]),
                          str(meta.get("generation") or meta.get("etag") or ""))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        found = await self.fs._glob(pattern, detail=True)
        return sorted(
            (ObjectInfo(self._key(name), int(m["size"]), str(m.get("generation") or ""))
             for name, m in found.items() if m.get("type", "file") == "file"),
        )

    async def read(self, path: str, start: int, end: int) -> bytes:
        headers = {"Range": f"bytes={start}-{end - 1}"}
        self.fs.credentials.apply(headers)
        generation = self.pins.get(self._key(path)) or None
        try:
            async with self.session.get(self.fs.url(path, generation=generation),
                                        headers=headers) as resp:
                status = resp.status
                if status in (200, 206):
                    body = await resp.read()
                    if status == 200 and len(body) > end - start:
                        body = body[start:end]  # server ignored the range
                    if len(body) != end - start:
                        raise _Transient(f"short body ({len(body)} of {end - start} bytes)")
                    return body
                text = (await resp.read())[:200].decode("utf-8", "replace")
        except self._aiohttp.ClientError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        if status == 404:
            url = self._key(path)
            if generation:
                raise ObjectChangedError(
                    f"{url} was replaced or deleted after it was opened (generation "
                    f"{generation} is gone); re-open the dataset to read the new object"
                )
            raise FileNotFoundError(f"no such object: {url}")
        if status in (401, 403):
            raise PermissionError(f"HTTP {status} reading gs://{path.removeprefix('gs://')}: "
                                  f"{text} (check credentials or storage_options['token'])")
        if status in RETRY_STATUSES:
            raise _Transient(f"HTTP {status}")
        raise StorageError(f"HTTP {status}: {text}")

    async def aclose(self) -> None:
        await self.session.close()
        if getattr(self.fs, "_session", None) is not None:
            await self.fs.session.close()


class _FsspecBackend:
    def __init__(self, protocol: str, options: dict[str, Any]) -> None:
        import fsspec

        cls = fsspec.get_filesystem_class(protocol)
        self.is_async = bool(getattr(cls, "async_impl", False))
        kw: dict[str, Any] = {"skip_instance_cache": True, **options}
        if self.is_async:
            kw.update(asynchronous=True, loop=asyncio.get_running_loop())
        self.fs = cls(**kw)
        self.protocol = protocol

    def _url(self, path: str) -> str:
        return path if "://" in path else f"{self.protocol}://{path}"

    async def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        if self.is_async:
            return await getattr(self.fs, "_" + name)(*args, **kw)
        return await asyncio.to_thread(getattr(self.fs, name), *args, **kw)

    async def info(self, path: str) -> ObjectInfo:
        meta = await self._call("info", path)
        version = meta.get("generation") or meta.get("ETag") or meta.get("mtime") or ""
        return ObjectInfo(self._url(path), int(meta["size"]), str(version))

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        found = await self._call("glob", pattern, detail=True)
        return sorted(ObjectInfo(self._url(n), int(m["size"]), str(m.get("mtime", "")))
                      for n, m in found.items() if m.get("type", "file") == "file")

    async def read(self, path: str, start: int, end: int) -> bytes:
        try:
            return await self._call("cat_file", path, start=start, end=end)
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except (OSError, asyncio.TimeoutError) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        close = getattr(self.fs, "close_session", None) if self.is_async else None
        session = getattr(self.fs, "_session", None)
        if close is not None and session is not None and hasattr(session, "close"):
            await session.close()


class _LoopState:
    def __init__(self, concurrency: int, max_bytes: int) -> None:
        self.slots = asyncio.Semaphore(concurrency)
        self.budget = _ByteBudget(max_bytes)
        self.backends: dict[str, Any] = {}


class Storage:
    """Byte ranges of local files and fsspec URLs under one concurrency and byte budget."""

    def __init__(
        self,
        *,
        concurrency: int = 64,
        max_inflight_bytes: int = 256 << 20,
        retry: RetryPolicy | None = None,
        storage_options: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.max_inflight_bytes = max_inflight_bytes
        self.retry = retry or RetryPolicy()
        self.storage_options = dict(storage_options or {})
        self.stats = IOStats()
        self._rng = random.Random(seed)
        self._pins: dict[str, str] = {}
        self._states: dict[asyncio.AbstractEventLoop, _LoopState] = {}

    # -- plumbing ---------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = _LoopState(self.concurrency, self.max_inflight_bytes)
        return state

    def _backend(self, url: str) -> tuple[Any, str]:
        state = self._state()
        if is_local(url):
            key, path = "file", url.removeprefix("file://")
        else:
            key, _, _ = url.partition("://")
            path = url
        backend = state.backends.get(key)
        if backend is None:
            if key == "file":
                backend = _LocalBackend(min(32, self.concurrency))
            elif key in ("gs", "gcs"):
                backend = _GCSBackend(self.storage_options, self.concurrency, self.retry,
                                      self._pins)
            else:
                backend = _FsspecBackend(key, self.storage_options)
            state.backends[key] = backend
        return backend, path

    # -- public -----------------------------------------------------------------------

    def pin(self, info: ObjectInfo) -> None:
        """Read this object at the version it had when listed (gs:// generations); a later
        rewrite then fails loudly with `ObjectChangedError` instead of mixing versions."""
        if not is_local(info.url) and info.version:
            self._pins[info.url] = info.version

    async def _bounded(self, what: str, url: str, coro: Any) -> Any:
        """Metadata calls go through the client's own retries; bound them by our deadline."""
        try:
            return await asyncio.wait_for(coro, self.retry.deadline)
        except asyncio.TimeoutError:
            raise StoreUnavailableError(f"{redact(url)}: {what} got no answer within "
                               f"{self.retry.deadline:g} s (the store is unavailable)") from None

    async def info(self, url: str) -> ObjectInfo:
        backend, path = self._backend(url)
        try:
            return await self._bounded("looking up its size", url, backend.info(path))
        except FileNotFoundError:
            raise FileNotFoundError(f"{redact(url)}: no such file or object") from None

    async def glob(self, pattern: str) -> list[ObjectInfo]:
        """Files matching `pattern`, sorted by URL, with their sizes (one listing)."""
        backend, path = self._backend(pattern)
        return await self._bounded("listing", pattern, backend.glob(path))

    async def read(self, url: str, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of `url`, retried on transient failures."""
        n = end - start
        if n <= 0:
            return b""
        self._check_budget(url, start, end)
        backend, path = self._backend(url)
        state = self._state()
        policy, stats = self.retry, self.stats
        await state.budget.acquire(n)
        try:
            began = time.monotonic()
            attempt = 0
            while True:
                attempt += 1
                async with state.slots:
                    stats.requests += 1
                    stats.in_flight += 1
                    stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
                    t0 = time.monotonic()
                    try:
                        data = await _within(backend.read(path, start, end), policy.timeout)
                        cause = None
                    except _Transient as exc:
                        cause = exc.cause
                    except asyncio.TimeoutError:
                        cause = f"no answer within {policy.timeout:g} s"
                    except (ConnectionError, TimeoutError) as exc:
                        cause = f"{type(exc).__name__}: {exc}"
                    except ObjectChangedError:
                        stats.failures += 1
                        raise
                    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
                        stats.failures += 1
                        raise type(exc)(f"{redact(url)} [{start}, {end}): {exc}") from None
                    finally:
                        stats.in_flight -= 1
                        stats.busy_seconds += time.monotonic() - t0
                if cause is None:
                    if len(data) != n:
                        stats.failures += 1
                        raise StorageError(
                            f"{redact(url)}: asked for bytes [{start}, {end}), got {len(data)}"
                            " (the file is shorter than when it was opened: re-open it)"
                        )
                    stats.reads += 1
                    stats.bytes += n
                    return data
                kind = cause.split(":")[0]
                stats.statuses[kind] = stats.statuses.get(kind, 0) + 1
                delay = policy.delay(attempt, self._rng)
                spent = time.monotonic() - began
                if attempt >= policy.attempts or spent + delay > policy.deadline:
                    stats.failures += 1
                    raise StoreUnavailableError(
                        f"{redact(url)}: reading bytes [{start}, {end}) failed after "
                        f"{attempt} attempts in {spent:.1f} s; last: {cause} (the store is "
                        "unavailable or overloaded; retry later, or raise RetryPolicy "
                        "attempts/deadline)"
                    )
                stats.retries += 1
                await asyncio.sleep(delay)
        finally:
            state.budget.release(n)

    def _check_budget(self, url: str, start: int, end: int) -> None:
        if end - start > self.max_inflight_bytes:
            raise StorageError(
                f"{redact(url)}: one read of bytes [{start}, {end}) ({end - start:,} bytes) is "
                f"larger than the memory budget ({self.max_inflight_bytes:,} bytes); raise "
                "memory_budget, or rewrite the file with a smaller group_size"
            )

    async def read_many(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Several reads at once, results in request order.

        Local reads go in a few batched thread-pool jobs (a thread hop costs more than a
        page-cache pread); remote reads each get their own request, all in flight at once.
        """
        local = [k for k, (url, _, _) in enumerate(requests) if is_local(url)]
        if len(local) < 2:
            return list(await asyncio.gather(*(self.read(u, s, e) for u, s, e in requests)))
        remote = [k for k, (url, _, _) in enumerate(requests) if not is_local(url)]
        out: list[bytes] = [b""] * len(requests)
        groups = max(1, min(self.concurrency, 32, len(local) // 16))
        jobs = [local[g::groups] for g in range(groups)]

        async def local_job(ks: list[int]) -> None:
            for k, data in zip(ks, await self._read_local([requests[k] for k in ks])):
                out[k] = data

        async def remote_one(k: int) -> None:
            out[k] = await self.read(*requests[k])

        await asyncio.gather(*(local_job(ks) for ks in jobs), *(remote_one(k) for k in remote))
        return out

    async def _read_local(self, items: Sequence[tuple[str, int, int]]) -> list[bytes]:
        backend, _ = self._backend("file://")
        for u, s, e in items:
            self._check_budget(u, s, e)
        paths = [(u.removeprefix("file://"), s, e) for u, s, e in items]
        total = sum(e - s for _, s, e in paths)
        state, stats = self._state(), self.stats
        await state.budget.acquire(total)
        try:
            async with state.slots:
                stats.requests += len(paths)
                t0 = time.monotonic()
                try:
                    datas = await backend.read_batch(paths)
                except FileNotFoundError as exc:
                    stats.failures += 1
                    raise FileNotFoundError(f"{exc.filename}: no such file") from None
                finally:
                    stats.busy_seconds += time.monotonic() - t0
            for (url, start, end), data in zip(items, datas):
                if len(data) != end - start:
                    stats.failures += 1
                    raise StorageError(
                        f"{redact(url)}: asked for bytes [{start}, {end}), got {len(data)}"
                        " (the file is shorter than when it was opened: re-open it)"
                    )
            stats.reads += len(paths)
            stats.bytes += total
            return datas
        finally:
            state.budget.release(total)

    async def aclose(self) -> None:
        """Release this loop's sessions, descriptors and threads."""
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            for backend in state.backends.values():
                await backend.aclose()

    def close_loop_states(self) -> None:
        """Forget states of loops that are already closed (their resources died with them)."""
        for loop in [lp for lp in self._states if lp.is_closed()]:
            del self._states[loop]
