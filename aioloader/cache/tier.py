"""The disk tier in the loader: records from local segment files where they are on disk,
from the bucket where not, while a background download fills the disk.

Segments are the table's runs of whole chunks of about `SEGMENT_BYTES` (`RecordTable.runs`),
so a record never straddles two. A task whose records all lie in segments on disk is
redirected to the entries (`local_refs`): worker processes read them themselves, like local
files (`ChunkRefs.read_from`: a byte `b` of the object is at `PAYLOAD_AT + b - start` of
the entry of the segment `[start, end)`). A task with some records still remote gets them
all as bytes (`fetch_refs`): those on disk read here (a thread, a pread each), the rest
through the bucket (under an exact shuffle nearly every task is mixed until the disk holds
nearly everything: asking the bucket again for those on disk would waste requests).

Segments reach the disk through `download` (each once per host; the background filler,
`start_filler`). Segments another process stored are found by the filler's pass (reads never
stat the disk per record). Once every segment is on disk, tasks grow as over local files
(`complete`). This module owns which segments are on disk, proved, and reading them.

The memory tier above (aioloader.cache.segments) fetches its segments — the same runs —
through `fetch_into`: from the entry when on disk, else downloaded (once per host, like the
filler's) straight into the memory tier's place and stored.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..index.planning import ChunkRefs
from .budget import GRACE_S
from .disk import PAYLOAD_AT, DiskCache, SegmentKey
from .download import DISK, Downloads
from .runindex import RunIndex
from .segments import SEGMENT_BYTES

TOUCH_S = GRACE_S / 4  # a segment in use is stamped again after this long


class DiskTier:
    """Segments of the files of one `RecordTable` (`table`) in `cache`, fetched through
    `storage` (`read(url, start, end)`)."""

    def __init__(self, cache: DiskCache, table: Any, storage: Any,
                 segment: int = SEGMENT_BYTES) -> None:
        self.cache = cache
        self.table = table
        self.storage = storage
        runs = table.runs(segment)
        files = table.files
        self.runs = RunIndex([f.size for f in files], runs)
        self.keys = [SegmentKey(files[f].url, files[f].version, s, e) for f, s, e in
                     zip(runs.file.tolist(), runs.start.tolist(), runs.end.tolist())]
        # Files without a version could be rewritten unseen: never cached.
        self.cacheable = np.array([bool(files[f].version) for f in runs.file.tolist()],
                                  dtype=bool)
        self.paths = [cache.path(k) for k in self.keys]
        self._shift = (PAYLOAD_AT - runs.start).tolist()
        self.have = np.zeros(len(runs), dtype=bool)  # on disk, proved by this process
        names = {os.path.basename(p) for p in self.paths}
        there = names.intersection(os.listdir(cache.dir_fd))  # stored before: prove on use
        self._listed = np.array([os.path.basename(p) in there for p in self.paths], dtype=bool)
        self._complete = False  # see `complete`
        self._file_of = {f.url: i for i, f in enumerate(files)}
        self._closed = False
        self.segments_local = 0  # the memory tier's segments read from disk
        self._known: list[tuple[int, int] | None] = [None] * len(runs)
        self._stamp = np.zeros(len(runs), dtype=np.float64)
        self._proving: asyncio.Lock | None = None
        # The disk work (checks, reads, writes) runs on threads of our own, so that closing
        # waits for them all before the directory's descriptor goes.
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="aioloader-disk")
        self.download = Downloads(self)
        self.records_local = self.records_remote = 0

    def __len__(self) -> int:
        return len(self.keys)

    def runs_of(self, refs: ChunkRefs) -> np.ndarray:
        """The segment of each record in `refs`."""
        files = refs.ids[refs.file]  # type: ignore[index]  # set for files
        out = self.runs.of(files, refs.start, refs.end)
        if out is None:
            raise AssertionError("a record outside its file's segments")
        return out

    filled = property(lambda self: self.download.filled,
                      doc="The filler finished: everything it could store is on disk.")
    downloads = property(lambda self: self.download.count,
                         doc="Segments this process downloaded.")

    def mark(self, r: int, known: tuple[int, int]) -> None:
        """Segment `r` is on disk, proved: the entry `known` (its st_dev, st_ino)."""
        self.have[r], self._known[r], self._stamp[r] = True, known, time.monotonic()

    def _forget(self, r: int) -> None:
        """Segment `r`'s entry vanished or went bad: it is read from the bucket again."""
        self.have[r], self._known[r], self._complete = False, None, False

    # -- the loader's calls -------------------------------------------------------------

    def complete(self) -> bool:
        """Whether every segment is on disk (or listed there, to be proved on first use):
        tasks may then grow as over local files."""
        if not self._complete:
            self._complete = bool((self.have | self._listed).all())
        return self._complete

    async def local_refs(self, refs: ChunkRefs) -> ChunkRefs | None:
        """`refs` read from the segment files when every record's segment is on disk (the
        workers read them); None when some are not (see `fetch_refs`)."""
        if refs.ids is None or not len(refs):
            return None
        runs = self.runs_of(refs)
        used, inverse = np.unique(runs, return_inverse=True)
        await self._prove(used)
        if not self.have[used].all() or not self._touch(used):
            return None
        self.records_local += len(refs)
        file = self.runs.file[used]
        names = [refs.name(f) for f in np.searchsorted(refs.ids, file).tolist()]
        u = used.tolist()
        return ChunkRefs(paths=[self.paths[r] for r in u], file=inverse.astype(np.int64),
                         chunk=refs.chunk, start=refs.start, end=refs.end,
                         within=refs.within, names=names,
                         shift=[self._shift[r] for r in u], count=refs.count,
                         ids=file.astype(np.int64),
                         idents=[self._known[r] for r in u],  # type: ignore[misc]  # all proved
                         format=refs.format)

    async def fetch_refs(self, refs: ChunkRefs, fetch: Any) -> list[Any]:
        """The physical bytes of each record's chunk: from the segment files for those on
        disk, through `fetch(refs_subset)` (the source's `fetch_refs`) for the others."""
        runs = self.runs_of(refs)
        await self._prove(np.unique(runs))
        local = self.have[runs]
        out: list[Any] = [None] * len(refs)
        if local.any():
            idx = np.flatnonzero(local)
            got = await self.thread(self._read_local, runs[idx], refs.start[idx],
                                    refs.end[idx])
            for i, b in zip(idx.tolist(), got):
                out[i] = b
            local[idx] = [b is not None for b in got]
        miss = np.flatnonzero(~local)
        if miss.size:
            try:
                views = await fetch(_subset(refs, miss))
            finally:
                self.download.first_read_done()
            for i, v in zip(miss.tolist(), views):
                out[i] = v
        self.records_local += len(refs) - int(miss.size)
        self.records_remote += int(miss.size)
        return out

    async def _prove(self, runs: np.ndarray) -> None:
        """Check the entries, stored before this process started, of these segments."""
        if not self._listed[runs].any():
            return
        if self._proving is None:
            self._proving = asyncio.Lock()
        async with self._proving:  # a task finds the proofs it needs done, not under way
            todo = runs[self._listed[runs] & ~self.have[runs]]
            if todo.size:
                await self.thread(lambda: [self._found_now(r) for r in todo.tolist()])
                self._listed[todo] = False
                self._complete = False  # (one may have failed its proof)

    def _read_local(self, runs: np.ndarray, starts: np.ndarray,
                    ends: np.ndarray) -> list[bytes | None]:
        """(A thread.) Records' bytes from their segments' entries; None where an entry
        vanished or went bad (it is then fetched from the bucket, and forgotten here)."""
        out: list[bytes | None] = [None] * len(runs)
        order = np.argsort(runs, kind="stable")
        bounds = np.flatnonzero(np.diff(runs[order])) + 1
        for group in np.split(order, bounds):
            r = int(runs[group[0]])
            got = self.cache.read(self.keys[r], self._known[r],
                                  list(zip(starts[group].tolist(), ends[group].tolist())))
            if got is None:
                self._forget(r)
                continue
            for i, b in zip(group.tolist(), got):
                out[i] = b
        return out

    def _touch(self, used: np.ndarray) -> bool:
        """Stamp segments in use (for the LRU, and so no one evicts them while a worker may
        open them); False if one has vanished (it is forgotten)."""
        now = time.monotonic()
        for r in used[now - self._stamp[used] > TOUCH_S].tolist():
            try:
                os.utime(self.paths[r])
            except OSError:
                self._forget(r)
                return False
            self._stamp[r] = now
        return True

    # -- segments -----------------------------------------------------------------------

    async def fetch_segment(self, r: int, *, wait: bool = True) -> bool:
        """Make segment `r` be on disk: found there (checked), or downloaded once per host
        (locked) and stored. False when it could not be stored (no room, a file without a
        version), or (`wait=False`) another process is downloading it now."""
        return await self.download.segment(r, wait) == DISK

    async def fetch_into(self, url: str, start: int, end: int, dest: memoryview) -> None:
        """The memory tier's `FetchSegment` (aioloader.cache.segments): its segments are the
        disk tier's, read from disk when there, else downloaded (once per host) into `dest`
        and stored, so a later epoch or job over a filled cache asks the bucket nothing."""
        r = self._run_at(url, start, end)
        if r is None or not self.cacheable[r] or self._closed:
            await self.storage.read_into(url, start, end, dest)
            return
        await self._prove(np.array([r]))
        if self.have[r] and await self.thread(self._read_into, r, dest):
            self.segments_local += 1
            return
        if self.download.full:  # the cache refused one lately: no scans
            await self.storage.read_into(url, start, end, dest)
            return
        box: list[Any] = [dest, False]  # filled by this call's download, if it is the one
        status = await self.download.segment(r, True, box)
        if box[1]:
            return
        if status == DISK and await self.thread(self._read_into, r, dest):
            self.segments_local += 1
            return
        await self.storage.read_into(url, start, end, dest)

    def _run_at(self, url: str, start: int, end: int) -> int | None:
        """The segment that is exactly bytes [start, end) of `url`, if any."""
        f = self._file_of.get(url)
        if f is None:
            return None
        got = self.runs.of(np.array([f]), np.array([start]), np.array([end]))
        if got is None or self.runs.start[got[0]] != start or self.runs.end[got[0]] != end:
            return None
        return int(got[0])

    def _read_into(self, r: int, dest: memoryview) -> bool:
        """(A thread.) Segment `r` from its entry into `dest`; False (and forgotten) when the
        entry vanished or went bad."""
        known = self.cache.read_into(self.keys[r], self._known[r], dest)
        if known is None:
            self._forget(r)
            return False
        self._known[r] = known
        return True

    async def found(self, r: int) -> bool:
        """Whether segment `r`'s entry is on disk and passes its checks (marked if so)."""
        return await self.thread(self._found_now, r)

    def _found_now(self, r: int) -> bool:
        """(A thread.) Whether segment `r`'s entry is on disk and passes its checks."""
        known = self.cache.verify(self.keys[r])
        if known is None:
            return False
        self.mark(r, known)
        return True

    def start_filler(self, concurrency: int, *, now: bool = False) -> None:
        """Download every segment not on disk, `concurrency` at a time, in the background:
        once the first read is done (`now`: at once), so the first batch does not wait
        behind whole segments."""
        self.download.start_filler(concurrency, now=now)

    def thread(self, fn: Any, *args: Any) -> asyncio.Future:
        """`fn(*args)` on the tier's disk threads."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def aclose(self) -> None:
        self._closed = True  # the memory tier's fetches go to the bucket from now on
        await self.download.aclose()
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)
        self.cache.close()

    def figures(self) -> dict[str, Any]:
        return {"disk_segments": int(self.have.sum()), "disk_total_segments": len(self),
                "disk_records_local": self.records_local,
                "disk_records_remote": self.records_remote,
                "disk_downloads": self.downloads, "disk_filled": self.filled,
                "disk_segments_read": self.segments_local,
                "disk_dropped": self.cache.dropped, "disk_evicted": self.cache.evicted}


def _subset(refs: ChunkRefs, idx: np.ndarray) -> ChunkRefs:
    """Records `idx` of `refs` (naming the same files)."""
    return ChunkRefs(refs.paths, refs.file[idx], refs.chunk[idx], refs.start[idx],
                     refs.end[idx], refs.within[idx], refs.names, refs.shift,
                     refs.count[idx] if refs.count is not None else None, refs.ids,
                     format=refs.format[idx] if refs.format is not None else None)
