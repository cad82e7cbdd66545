"""gs:// range reads on libcurl (`curl.CurlSession`), at about half the client CPU per GET of
a Python HTTP client (benchmarks/RESULTS.md, "cost per request").

Only the reads are libcurl's: listing, metadata lookups and credentials are gcsfs's
(`gcs_store.GcsStore`), made only when one of them is first needed. With no credentials to
fetch (`token="anon"`, or an emulator) opening files by name and reading them never imports
gcsfs nor aiohttp; with credentials, gcsfs is imported on a thread from the moment the
backend is made, so the import overlaps the rest of start-up.

One attempt per call, `Transient` for what is worth retrying, reads pinned to the generation
seen at open, progress told to the caller's `retry.Watch` (the head counts as heard with the
first body bytes), no timeouts of its own. One suffix-range GET opens an object: its answer
carries the tail, the size (`Content-Range`) and the generation (`x-goog-generation`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ...errors import Transient
from ...urls import redact
from ..backends import Tail
from ..hedge import Watch
from .curl import CurlSession
from .store import GcsStore, gcs_failure, parse_tail, range_body

__all__ = ["CurlGCSBackend"]


class CurlGCSBackend(GcsStore):
    streams = True  # reads take a `retry.Watch`: silence is timed, slow heads are hedged

    def __init__(self, options: dict[str, Any], connections: int,
                 pins: dict[str, str]) -> None:
        super().__init__(options, pins, lazy=True)
        self._urls: dict[tuple[str, str | None], str] = {}
        self.session = CurlSession(connections, multiplex=self._base.startswith("https:"))

    async def _auth(self) -> list[str]:
        """The request headers that carry credentials (none for anonymous access)."""
        if self._anon:
            return []
        headers: dict[str, str] = {}
        (await self._gcsfs()).credentials.apply(headers)
        return [f"{k}: {v}" for k, v in headers.items()]

    def _http_url(self, path: str, generation: str | None) -> str:
        """The JSON API download URL, built once per object and generation."""
        url = self._urls.get((path, generation))
        if url is None:
            bucket, _, name = self._key(path)[5:].partition("/")
            url = (f"{self._base}/download/storage/v1/b/{quote(bucket, safe='')}/o/"
                   f"{quote(name, safe='')}?alt=media")
            if generation:
                url += f"&generation={generation}"
            self._urls[(path, generation)] = url
        return url

    async def read(self, path: str, start: int, end: int, watch: Watch | None = None) -> bytes:
        return await self._get(path, start, end, None, watch)

    async def read_into(self, path: str, start: int, end: int, dest: memoryview,
                        watch: Watch | None = None) -> None:
        """Bytes `[start, end)` written into `dest` as they arrive: a large read (a segment
        of a dataset kept in memory) lands where it is kept, not joined and copied there."""
        await self._get(path, start, end, dest, watch)

    async def _get(self, path: str, start: int, end: int, dest: memoryview | None,
                   watch: Watch | None) -> Any:
        n = end - start
        generation = self._generation(path)
        auth = [] if self._anon else await self._auth()
        resp = await self.session.get(self._http_url(path, generation), start, end, auth,
                                      dest=dest, watch=watch)
        status = resp.status
        if status == 206 and dest is not None:
            if resp.got != n:
                raise Transient(f"short body ({resp.got} of {n} bytes)")
            return None
        if status in (200, 206):
            return range_body(status, resp.body, start, end, dest)
        raise gcs_failure(self._key(path), status, _text(resp.body), generation,
                          self._hint)

    async def read_tail(self, path: str, n: int, watch: Watch | None = None) -> Tail | None:
        """Size, generation and the last `n` bytes (all of a smaller object) in one GET.

        None when the answer cannot give them (416: an empty object on real GCS; no
        `x-goog-generation` header): the caller then asks `info()` and reads as usual.
        """
        auth = [] if self._anon else await self._auth()
        resp = await self.session.get(self._http_url(path, None), None, n, auth, watch=watch,
                                      headers=True)
        if resp.status not in (200, 206, 416):
            raise gcs_failure(self._key(path), resp.status, _text(resp.body), None,
                              self._hint)
        return parse_tail(self._key(path), n, resp.status, resp.body,
                          resp.header_value("Content-Range"),
                          resp.header_value("x-goog-generation"))

    async def aclose(self) -> None:
        await self.session.aclose()
        await super().aclose()


def _text(body: bytes) -> str:
    return redact(body[:200].decode("utf-8", "replace"))
