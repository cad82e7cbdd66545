"""Reading records' chunks from local files (and from the memory copy of a remote dataset)
in the process that decodes them: a worker, or the inline pool of `workers=0`."""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from ..errors import ObjectChangedError
from ..planning import ChunkRefs
from ..shortread import short_read_error


class LocalFiles:
    """Descriptors of the local files a worker reads records from, each opened once.

    Reading in the worker, not the parent, keeps the parent's per-record work to a few
    vectorized lookups: the reads run in parallel across workers. The memory copy of a
    remote dataset (`ChunkRefs.shift` set, see aioloader.resident) is mapped instead, and its
    records are slices of the map: no system call per record. A disk file is never mapped:
    one truncated under us would kill the worker with SIGBUS instead of an error naming it;
    the memory copy is ours, sized once and never shrunk while the pool lives.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._maps: dict[str, memoryview] = {}
        self.reads = 0
        self.bytes = 0

    def fd(self, url: str) -> int:
        """The descriptor of the local file `url` (opened on first use, kept)."""
        return self._fd(url)

    def _fd(self, url: str) -> int:
        fd = self._fds.get(url)
        if fd is None:
            path = url.removeprefix("file://")
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                raise ObjectChangedError(f"{path} was deleted after it was opened: re-open "
                                         "the dataset") from None
            self._fds[url] = fd
        return fd

    def _map(self, path: str) -> memoryview:
        view = self._maps.get(path)
        if view is None:
            view = self._maps[path] = memoryview(mmap.mmap(self._fd(path), 0,
                                                           access=mmap.ACCESS_READ))
        return view

    def read(self, refs: ChunkRefs) -> list:
        want = refs.end - refs.start
        starts, lengths = refs.start.tolist(), want.tolist()
        if refs.shift is None:
            pread, fds = os.pread, [self._fd(u) for u in refs.paths]
            out: list = [pread(fds[f], n, s) for f, s, n in
                         zip(refs.file.tolist(), starts, lengths)]
        else:  # the memory copy holds file f from shift[f] on
            at = refs.start + np.asarray(refs.shift, dtype=np.int64)[refs.file]
            maps = [self._map(u) for u in refs.paths]
            out = [maps[f][s : s + n] for f, s, n in
                   zip(refs.file.tolist(), at.tolist(), lengths)]
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
            mem = view.obj
            view.release()
            with contextlib.suppress(BufferError):  # slices still held: unmapped with them
                mem.close()  # type: ignore[attr-defined]
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
