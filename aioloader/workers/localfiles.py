"""Reading records' chunks from local files (and from the memory copy of a remote dataset)
in the process that decodes them: a worker, or the inline pool of `workers=0`."""

from __future__ import annotations

import contextlib
import mmap
import os
import resource
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from ..cache.entry import PAYLOAD_AT, EntryError, check_named
from ..errors import ObjectChangedError
from ..index.planning import ChunkRefs
from ..io.descriptors import FileSet, spans
from ..io.shortread import short_read_error

# Disk tier entries kept mapped across tasks, least recently used dropped first: each holds
# a descriptor (and, once evicted from the cache, its disk space) until dropped here.
MAX_OPEN_ENTRIES = max(16, min(512, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4))


class _Entry(NamedTuple):
    view: memoryview  # the entry mapped whole
    proved: tuple[int, int]  # the (dev, inode) the parent named when it was opened


class LocalFiles:
    """Descriptors of the local files a worker reads records from, lent by the process's
    capped set (`aioloader.io.descriptors`): a task holds those of the files it reads, at most
    `limit` at once (a task over more files is read in consecutive spans, `spans`).

    Reading in the worker, not the parent, keeps the parent's per-record work to a few
    vectorized lookups: the reads run in parallel across workers. The memory copy of a
    remote dataset (`ChunkRefs.shift` set, see aioloader.resident) is mapped instead, and its
    records are slices of the map: no system call per record. A disk file is never mapped:
    one truncated under us would kill the worker with SIGBUS instead of an error naming it;
    the memory copy is ours, sized once and never shrunk while the pool lives.

    A disk tier entry (`ChunkRefs.idents` set) is mapped too: it is ours, written whole and
    renamed into place, never changed in place. The parent proved each entry it names by
    its (dev, inode); a map is kept across tasks (`MAX_OPEN_ENTRIES`, LRU) and used while
    the parent names the same proof. An entry met under another identity (another process
    dropped and re-wrote it meanwhile) is checked here, whole, before any byte is used.
    """

    def __init__(self) -> None:
        self._files = FileSet()
        self._maps: dict[str, memoryview] = {}
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.entries_opened = 0
        self.reads = 0
        self.bytes = 0

    def spans(self, refs: ChunkRefs) -> list[tuple[int, int]]:
        """Consecutive ranges of `refs`' records, each over at most `limit` files."""
        limit = self._files.limit
        if len(refs.paths) <= limit:
            return [(0, len(refs))]
        return spans(refs.file.tolist(), len(refs.paths), limit)

    def hold(self, urls: list[str]) -> list[int]:
        """Descriptors of the local files `urls` (at most `limit`), lent until `let_go`."""
        return self._files.hold([u.removeprefix("file://") for u in urls])

    def let_go(self, urls: list[str], fds: list[int]) -> None:
        self._files.let_go([u.removeprefix("file://") for u in urls], fds)

    def _map(self, path: str) -> memoryview:
        view = self._maps.get(path)
        if view is None:
            fd = os.open(path.removeprefix("file://"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                view = self._maps[path] = memoryview(mmap.mmap(fd, 0,
                                                               access=mmap.ACCESS_READ))
            finally:
                os.close(fd)  # the map holds its own
        return view

    def _entry(self, path: str, proved: tuple[int, int], start: int, name: str) -> memoryview:
        """Disk tier entry `path` (of the segment from byte `start` of `name`), as the
        parent proved it (`proved`), or as checked here if it has been replaced since."""
        entries = self._entries
        e = entries.get(path)
        if e is not None and e.proved == proved:
            entries.move_to_end(path)
            return e.view
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            raise ObjectChangedError(f"the disk cache entry {path} of {name} went away "
                                     f"while in use ({err.strerror})") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != tuple(proved):
                try:
                    check_named(fd, st, os.path.basename(path), start)
                except EntryError as err:
                    raise ObjectChangedError(f"the disk cache entry {path} of {name} was "
                                             f"replaced while in use, and {err}") from None
            view = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
        finally:
            os.close(fd)  # the map holds its own
        if e is not None:
            _unmap(entries.pop(path).view)
        entries[path] = _Entry(view, proved)
        self.entries_opened += 1
        return view

    def _trim(self) -> None:
        """Down to MAX_OPEN_ENTRIES, after a task (whose own maps must stay until read)."""
        entries = self._entries
        while len(entries) > MAX_OPEN_ENTRIES:
            _unmap(entries.popitem(last=False)[1].view)

    def read(self, refs: ChunkRefs) -> list:
        if refs.shift is None:
            cuts = self.spans(refs)
            if len(cuts) > 1:
                return [r for lo, hi in cuts for r in self.read(refs.take(lo, hi))]
        want = refs.end - refs.start
        starts, lengths = refs.start.tolist(), want.tolist()
        if refs.shift is None:
            fds = self.hold(refs.paths)
            try:
                pread = os.pread
                out: list = [pread(fds[f], n, s) for f, s, n in
                             zip(refs.file.tolist(), starts, lengths)]
            finally:
                self.let_go(refs.paths, fds)
        else:  # the memory copy holds file f from shift[f] on
            at = refs.start + np.asarray(refs.shift, dtype=np.int64)[refs.file]
            if refs.idents is None:
                maps = [self._map(u) for u in refs.paths]
            else:  # segment entries: file f's byte b at shift[f] + b, so it starts at
                maps = [self._entry(u, i, PAYLOAD_AT - sh, refs.name(f))  # PAYLOAD_AT - shift
                        for f, (u, i, sh) in enumerate(zip(refs.paths, refs.idents,
                                                           refs.shift))]
            out = [maps[f][s : s + n] for f, s, n in
                   zip(refs.file.tolist(), at.tolist(), lengths)]
            if len(self._entries) > MAX_OPEN_ENTRIES:
                self._trim()
        got = np.fromiter(map(len, out), dtype=np.int64, count=len(out))
        if (got != want).any():
            k = int(np.flatnonzero(got != want)[0])
            raise short_read_error(refs.name(int(refs.file[k])), starts[k],
                                   int(refs.end[k]), int(got[k]))
        self.reads += len(out)
        self.bytes += int(want.sum())
        return out

    def close(self) -> None:
        for view in self._maps.values():
            _unmap(view)
        self._maps.clear()
        for e in self._entries.values():
            _unmap(e.view)
        self._entries.clear()
        self._files.close()


def _unmap(view: memoryview) -> None:
    mem = view.obj
    view.release()
    with contextlib.suppress(BufferError):  # slices still held: unmapped with them
        mem.close()  # type: ignore[attr-defined]
