"""Turning a task's chunk refs (and, for remote files, the fetched chunk bytes) into records, in
the process that runs the task: a worker, or the inline pool of `workers=0`.

Every group size goes this one way. With group size 1 (the layout of shuffled training data)
every record is its own chunk: read from a local file, each is read into one reused buffer
and decoded from there (`ones.read_ones`: no buffer per read, no copy to cut out block
headers); fetched bytes go to `decode_records`, which decodes a task's records in one call. With
larger groups many records of a task share a chunk: each distinct chunk is read (local files)
or shipped (remote bytes, deduplicated by the pool) once and decoded once per task, and kept,
decoded, in a byte-bounded LRU (`ChunkCache`) for the next tasks, which with a block shuffle
or a sequential read ask for the same chunks again. One-record chunks are not cached:
`decode_records` decodes them inline in a few microseconds. Records of other formats are
decoded by their format (`workers.formatreads`).
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import formats as fmts
from ..arrayrecord import ArrayRecordFormatError
from ..arrayrecord.chunk import DEFAULT_MAX_DECODED, DEFAULT_VERIFY
from ..arrayrecord.errors import CORRUPT_HINT
from ..arrayrecord.index import decode_chunk, decode_records
from ..arrayrecord.layout import BLOCK_HEADER_SIZE
from ..arrayrecord.onerecord import MAX_HEADERS
from ..index.planning import ChunkRefs
from . import formatreads, formatstash
from .chunkcache import ChunkCache, chunk_keys, unpacked
from .contexts import FileStates
from .extract import HEAD, extract, lookup, read_entry, slices
from .localfiles import LocalFiles
from .messages import DEFAULT_CHUNK_CACHE_BYTES, SPILL_BAD, Fill, StashRef
from .ones import PREADV, read_ones
from .spill import SpillWriter, read_into


def _check_within(refs: ChunkRefs, names: list[str]) -> None:
    """Every record's place is inside its chunk (decode_chunk holds a chunk to the count)."""
    bad = np.flatnonzero((refs.within < 0) | (refs.within >= refs.count))
    if bad.size:
        i = int(bad[0])
        raise ArrayRecordFormatError(
            f"record {int(refs.within[i])} asked of a chunk of "
            f"{int(refs.count[i])} records",  # type: ignore[index]  # counts known here
            path=names[int(refs.file[i])], offset=int(refs.start[i]),
            chunk=int(refs.chunk[i]), hint=CORRUPT_HINT)


def _read_here_one_by_one(refs: ChunkRefs, raws: Sequence | None) -> bool:
    """Whether one-record chunks of `refs` are read here, each into a reused buffer
    (`ones.read_ones`): local files (not fetched bytes or a memory copy), where `preadv` is."""
    return raws is None and refs.shift is None and PREADV is not None


class Decoder:
    """What one decoding process keeps across tasks: its local file descriptors (`files`) and
    its cache of decoded multi-record chunks; and for the last task, `decoded` and `hits`
    (multi-record chunks it decoded, and found already decoded in the cache)."""

    def __init__(self, cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES) -> None:
        self.files = LocalFiles()
        self.cache = ChunkCache(cache_bytes)
        self._stash: tuple[str, mmap.mmap] | None = None  # the stash file, mapped
        self.stash_index = formatstash.StashIndex()  # (stashable formats' entries read)
        self.decoded = self.hits = self.spilled = 0  # (`spilled`: of the last fill job)
        self.missed = 0  # records of the last task its horizon's entries lacked
        self._bufs = [bytearray(1 << 17), bytearray(1 << 17)]  # `read_ones`' chunks
        self._headers = memoryview(bytearray(MAX_HEADERS * BLOCK_HEADER_SIZE))
        # How records of each format are decoded here (by format code): ArrayRecord by its
        # own paths below; any other by its format's `decode_records` (`formatreads`).
        self._readers = {fmts.code(fmts.ARRAYRECORD): self._arrayrecord}
        self.states = FileStates()  # contextual formats' per-file states (`contexts`)
        self.table = ""  # the task's table token: what `states` are keyed by

    def records(self, refs: ChunkRefs, raws: Sequence | None, *, verify: str = DEFAULT_VERIFY,
                max_decoded: int = DEFAULT_MAX_DECODED,
                paths: Sequence[str] | None = None,
                stash: StashRef | None = None, table: str = "") -> list[Any]:
        """Record `refs.within[i]` of the chunk `refs` places record i in, for every i.

        `raws[i]` is that chunk's physical bytes (records of one chunk may share them), or
        None: the files are local (or the memory copy of a remote dataset) and are read
        here. `paths` names each record's file in errors (group size 1; otherwise the
        names come from `refs`). `stash`: where the task's horizon keeps what it wants of
        each large chunk (`workers.extract`); the chunks are then not decoded whole.
        Records of several formats (a mix) are decoded by format, then put back in order;
        those of a contextual format by their files' states (`states`, of `table`).
        """
        self.decoded = self.hits = self.missed = 0
        self.table = table
        kinds = refs.format
        codes = [fmts.code(fmts.ARRAYRECORD)] if kinds is None or not len(kinds) else \
            np.unique(kinds).tolist()
        if len(codes) == 1:
            return self._reader(codes[0])(refs, raws, verify, max_decoded, paths, stash)
        out: list[Any] = [None] * len(refs)
        for c in codes:
            idx = np.flatnonzero(kinds == c)
            got = self._reader(c)(refs.pick(idx),
                                  None if raws is None else [raws[i] for i in idx.tolist()],
                                  verify, max_decoded,
                                  None if paths is None else [paths[i] for i in idx.tolist()],
                                  stash)
            for i, record in zip(idx.tolist(), got):
                out[i] = record
        return out

    def into(self, refs: ChunkRefs, raws: Sequence | None, rows: Sequence, *, verify: str,
             max_decoded: int, paths: Sequence[str], stash: StashRef | None = None,
             table: str = "") -> list[Any]:
        """`records`, but each record of a local one-record ArrayRecord chunk is put in its
        row of `rows` (1-d uint8 arrays, one a record) as it is decoded, where it is exactly
        that size, None standing for it in the list (`ones.read_ones`)."""
        if _read_here_one_by_one(refs, raws) and chunk_keys(refs) is None and (
                refs.format is None or bool((refs.format == fmts.code(fmts.ARRAYRECORD)).all())):
            self.decoded = self.hits = self.missed = 0
            return read_ones(self.files, self._bufs, self._headers, refs, verify,
                             max_decoded, paths, rows)
        return self.records(refs, raws, verify=verify, max_decoded=max_decoded, paths=paths,
                            stash=stash, table=table)

    def _reader(self, code: int) -> Any:
        return self._readers.get(code, functools.partial(formatreads.records, self))

    def _arrayrecord(self, refs: ChunkRefs, raws: Sequence | None, verify: str,
                     max_decoded: int, paths: Sequence[str] | None,
                     stash: StashRef | None) -> list[bytes]:
        """Records of ArrayRecord chunks: one call for one-record chunks (read in place from
        local files), each shared chunk decoded once, large ones through the stash."""
        keys = chunk_keys(refs)
        if keys is None:  # group size 1: one call decodes them all
            if _read_here_one_by_one(refs, raws):
                return read_ones(self.files, self._bufs, self._headers, refs, verify,
                                 max_decoded, paths)
            if raws is None:
                raws = self.files.read(refs)
            return decode_records(raws, refs.start.tolist(), refs.within.tolist(),
                                  verify=verify, paths=paths, chunks=refs.chunk.tolist(),
                                  counts=None if refs.count is None else refs.count.tolist(),
                                  max_decoded=max_decoded)
        if stash is not None:  # (whole chunks no longer wanted: their cache goes)
            self.cache.clear()
            return self._stashed(refs, raws, keys, verify, max_decoded, stash)
        return self._shared(refs, raws, keys, verify, max_decoded)

    def _shared(self, refs: ChunkRefs, raws: Sequence | None, keys: list[tuple[int, int]],
                verify: str, max_decoded: int) -> list[bytes]:
        """Records of chunks that hold several: each distinct chunk read and decoded once."""
        number: dict[tuple[int, int], int] = {}
        first: list[int] = []  # a record of each distinct chunk
        inverse = []  # each record's distinct chunk
        for i, key in enumerate(keys):
            j = number.get(key)
            if j is None:
                j = number[key] = len(first)
                first.append(i)
            inverse.append(j)
        counts = refs.count.tolist()  # type: ignore[union-attr]
        names = [refs.name(f) for f in range(len(refs.paths))]
        file, start = refs.file.tolist(), refs.start.tolist()
        _check_within(refs, names)
        # Cached by where the bytes lie (a memory copy holds every file, file f at shift[f]).
        shift = refs.shift or [0] * len(refs.paths)
        where = [(refs.paths[file[i]], shift[file[i]] + start[i]) for i in first]
        chunks: list[Any] = [None] * len(first)
        missing = []  # the distinct chunks to decode
        get = self.cache.get
        for j, i in enumerate(first):
            hit = get(where[j]) if counts[i] > 1 else None
            if hit is None:
                missing.append(j)
            else:
                chunks[j] = hit
        self.hits += len(first) - len(missing)
        if missing:
            take = [first[j] for j in missing]
            got = (self.files.read(refs.pick(np.asarray(take, dtype=np.int64)))
                   if raws is None else [raws[i] for i in take])
            for j, i, raw in zip(missing, take, got):
                _, records = decode_chunk(raw, start[i], verify=verify, path=names[file[i]],
                                          chunk=int(refs.chunk[i]),
                                          expected_records=counts[i], max_decoded=max_decoded,
                                          whole_range=True)
                chunks[j] = chunk = unpacked(records)
                if counts[i] > 1:
                    self.decoded += 1
                    self.cache.put(where[j], chunk)
        out: list[Any] = []
        append = out.append
        for j, w in zip(inverse, refs.within.tolist()):
            data, bounds = chunks[j]
            append(data[bounds[w] : bounds[w + 1]])
        return out

    def _stashed(self, refs: ChunkRefs, raws: Sequence | None, keys: list[tuple[int, int]],
                 verify: str, max_decoded: int, stash: StashRef) -> list[bytes]:
        """Records of large chunks from the horizon's entries in the stash file; those of
        a chunk it lacks (any of the task's) are pulled out for this task alone."""
        view = self.view(stash.path)
        names = [refs.name(f) for f in range(len(refs.paths))]
        _check_within(refs, names)
        file, start, within = refs.file, refs.start, refs.within
        order = np.lexsort((start, file))
        f_sorted, s_sorted = file[order], start[order]
        cut = np.flatnonzero((f_sorted[1:] != f_sorted[:-1]) | (s_sorted[1:] != s_sorted[:-1]))
        groups = np.split(order, cut + 1) if len(order) else []
        out: list[Any] = [None] * len(refs)
        missing: list[tuple[np.ndarray, tuple[str, int]]] = []
        for idx in groups:
            i = int(idx[0])
            key = (names[int(file[i])], int(start[i]))
            at = stash.at.get(key)
            entry = read_entry(view[at[0] : at[0] + at[1]]) if at is not None else None
            pos = lookup(entry, within[idx]) if entry is not None else None
            if pos is None:
                missing.append((idx, key))
            else:
                _fill(out, idx, pos, entry)  # type: ignore[arg-type]
        self.hits += len(groups) - len(missing)
        for idx, key in missing:  # one chunk read at a time (their bytes may be the file)
            wanted = np.unique(within[idx]).astype(np.int64)
            entry = self._extract(refs, raws, int(idx[0]), key[0], wanted, verify,
                                  max_decoded)
            _fill(out, idx, np.searchsorted(wanted, within[idx]), entry)
        return out

    def fill(self, refs: ChunkRefs, raws: Sequence | None, job: Fill, *,
             verify: str = DEFAULT_VERIFY, max_decoded: int = DEFAULT_MAX_DECODED,
             table: str = "") -> int:
        """A fill job: records `job.wanted` of the chunk of `refs`' first record pulled out
        into the job's region of the stash file; how many went in (a prefix).

        With `job.spill`, the chunk's records are read from the spill instead (`spilled`:
        `SPILL_BAD` if they did not check), or are written there as well (`spilled`: what
        `SpillWriter.end` said)."""
        self.cache.clear()
        self.spilled = 0
        if job.size < HEAD + 8 or not len(refs):
            return 0
        names = [refs.name(f) for f in range(len(refs.paths))]
        _check_within(refs, names)
        region = self.view(job.path)[job.offset : job.offset + job.size]
        code = fmts.code(fmts.ARRAYRECORD) if refs.format is None else int(refs.format[0])
        if code != fmts.code(fmts.ARRAYRECORD):  # (its format decodes the chunk; no spill)
            return formatreads.fill(self, fmts.by_code(code), refs, raws, job, region, names,
                                    verify, max_decoded, table)
        wanted, spill = np.asarray(job.wanted, dtype=np.int64), job.spill
        if spill is not None and not spill.write:  # decoded before: copied out of the spill
            got = read_into(spill, wanted, functools.partial(slices, into=region))
            self.spilled, self.hits = (SPILL_BAD, 0) if got is None else (0, 1)
            return 0 if got is None else len(got[0])
        writer = SpillWriter(spill) if spill is not None else None
        try:
            wanted = self._extract(refs, raws, 0, names[int(refs.file[0])], wanted, verify,
                                   max_decoded, into=region, sink=writer)[0]
        finally:
            if writer is not None:
                self.spilled = writer.end()
        return len(wanted)

    def _extract(self, refs: ChunkRefs, raws: Sequence | None, i: int, name: str,
                 wanted: np.ndarray, verify: str, max_decoded: int,
                 into: memoryview | None = None, sink: SpillWriter | None = None) -> Any:
        """Records `wanted` of record i's chunk pulled out in one streamed pass (its
        physical bytes fetched, `raws`, or read here)."""
        raw = raws[i] if raws is not None else \
            self.files.read(refs.pick(np.asarray([i], dtype=np.int64)))[0]
        self.decoded += 1
        return extract(raw, int(refs.start[i]), wanted, verify=verify, path=name,
                       chunk=int(refs.chunk[i]),
                       expected_records=int(refs.count[i]),  # type: ignore[index]
                       max_decoded=max_decoded, into=into, sink=sink)

    def view(self, path: str) -> memoryview:
        """The stash file at `path`, mapped once (a pool has one for its life)."""
        if self._stash is None or self._stash[0] != path:
            self._unmap()
            fd = os.open(path, os.O_RDWR)
            try:
                self._stash = (path, mmap.mmap(fd, 0))
            finally:
                os.close(fd)
        return memoryview(self._stash[1])

    def _unmap(self) -> None:
        old, self._stash = self._stash, None
        if old is not None:
            with contextlib.suppress(BufferError):  # (a view still held: it goes with it)
                old[1].close()

    def close(self) -> None:
        self.files.close()
        self._unmap()


def _fill(out: list, idx: np.ndarray, pos: np.ndarray, entry: Any) -> None:
    """Records at `pos` of a stash entry, into their places `idx` of `out` (as bytes: the
    entry's data is a view)."""
    offs, data = entry[1], entry[2]
    for i, a, b in zip(idx.tolist(), offs[pos].tolist(), offs[pos + 1].tolist()):
        out[i] = bytes(data[a:b])
