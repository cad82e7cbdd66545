"""Byte ranges → merged reads (pure, no I/O).

Given the byte ranges a batch needs (one per record, usually the record's chunk), sort them
by (file, offset), drop duplicates, and merge neighbours whose gap is at most `max_gap` into
reads of at most `max_merged` bytes. Fewer, larger reads are what object stores and disks
want: a request costs a round trip (tens of ms on GCS) no matter its size, so reading a
small gap is cheaper than issuing another request. Every input range keeps its place: the
plan says which read holds it and at what offset.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

# Merge when reading the gap costs less than issuing another request. Local (page cache,
# batched preads): a pread costs about as much as copying ~16 KiB. Cloud: a request costs
# client CPU and a connection slot, about what ~256 KiB of transfer costs.
LOCAL_MAX_GAP = 16 << 10
CLOUD_MAX_GAP = 256 << 10
DEFAULT_MAX_MERGED = 8 << 20
# ... but never read more than this many times the bytes actually needed: on a small
# dataset every gap is small, and reading it all for each batch wastes the network.
DEFAULT_MAX_AMPLIFICATION = 4.0


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """Merged reads, and where each requested range sits in them.

    Read r covers bytes `[read_start[r], read_end[r])` of file `read_file[r]`; requested range
    i is `item_length[i]` bytes at offset `item_offset[i]` of read `item_read[i]`.
    """

    read_file: np.ndarray
    read_start: np.ndarray
    read_end: np.ndarray
    item_read: np.ndarray
    item_offset: np.ndarray
    item_length: np.ndarray

    @property
    def num_reads(self) -> int:
        return len(self.read_file)

    @property
    def bytes_read(self) -> int:
        return int((self.read_end - self.read_start).sum())


@dataclass(frozen=True)
class ChunkRefs:
    """Where the chunk of each of a list of records lies (parallel arrays, one per record).

    `file` indexes `paths` (where to read); `start`/`end` are the chunk's physical byte
    range; `chunk` is its number in its file, `within` the record's place in the chunk.
    `names` (default: `paths`) are what errors call the files when `paths` are copies, and
    `shift[f]` (default 0) is where file f's byte 0 sits in its copy. `ids[f]` is file f's
    number in its source (`ArrayRecordSource.urls`): the parent fetches by it, so a file is
    never looked up again by its URL; workers read by `paths`. `format[i]` is record i's
    format code (`aioloader.formats`), which the workers decode it by.
    """

    paths: list[str]
    file: np.ndarray
    chunk: np.ndarray
    start: np.ndarray
    end: np.ndarray
    within: np.ndarray
    names: list[str] | None = None
    shift: list[int] | None = None
    count: np.ndarray | None = None  # the footer's record count of each record's chunk
    ids: np.ndarray | None = None  # the source's number of each file in `paths`
    # (dev, inode) of each of `paths` as the parent proved it (disk tier entries: see
    # aioloader.workers.localfiles); None for files read as they are
    idents: list[tuple[int, int]] | None = None
    # each record's format code (`aioloader.formats.code`); None: every record ArrayRecord
    format: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.file)

    def name(self, f: int) -> str:
        return (self.names or self.paths)[f]

    def chunk_keys(self) -> np.ndarray:
        """One number per record, the same for the records of one chunk (its file and
        offset), distinct between chunks."""
        return self.file * (1 << 44) + self.start

    def take(self, lo: int, hi: int) -> ChunkRefs:
        """Records `lo..hi-1`, naming only the files they use (in the order of `paths`).

        Files are few and dense (0..len(paths)-1): a count per file and a renumbering
        table do what `np.unique` would, in linear time (a task's cut, every task)."""
        file = self.file[lo:hi]
        used = np.flatnonzero(np.bincount(file, minlength=len(self.paths)))
        number = np.empty(len(self.paths), dtype=np.int64)
        number[used] = np.arange(len(used), dtype=np.int64)
        u = used.tolist()
        return ChunkRefs([self.paths[f] for f in u], number[file],
                         self.chunk[lo:hi], self.start[lo:hi], self.end[lo:hi],
                         self.within[lo:hi],
                         [self.names[f] for f in u] if self.names is not None else None,
                         [self.shift[f] for f in u] if self.shift is not None else None,
                         self.count[lo:hi] if self.count is not None else None,
                         self.ids[used] if self.ids is not None else None,
                         [self.idents[f] for f in u] if self.idents is not None else None,
                         self.format[lo:hi] if self.format is not None else None)

    def pick(self, idx: np.ndarray) -> ChunkRefs:
        """Records `idx` (any order, repeats allowed), with the same files and names."""
        return dataclasses.replace(
            self, file=self.file[idx], chunk=self.chunk[idx], start=self.start[idx],
            end=self.end[idx], within=self.within[idx],
            count=self.count[idx] if self.count is not None else None,
            format=self.format[idx] if self.format is not None else None)

    def read_from(self, paths: list[str], shift: list[int]) -> ChunkRefs:
        """The same records, read from copies of the files (file f's byte 0 at `shift[f]`
        of `paths[f]`), still named by the originals in errors."""
        return dataclasses.replace(self, paths=paths, shift=shift,
                                   names=self.names or self.paths)


def _ranges(files, starts, ends, names: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three int64 columns of one length, each range ending at or after its start."""
    f, s, e = (np.asarray(x, dtype=np.int64) for x in (files, starts, ends))
    if not (len(s) == len(e) == len(f)):
        raise ValueError(f"{names} must have the same length")
    if len(f) and (e < s).any():
        raise ValueError("a range ends before it starts")
    return f, s, e


def plan_reads(
    files,
    starts,
    ends,
    *,
    max_gap: int = LOCAL_MAX_GAP,
    max_merged: int = DEFAULT_MAX_MERGED,
    max_amplification: float = DEFAULT_MAX_AMPLIFICATION,
) -> ReadPlan:
    """Merge the ranges `[starts[i], ends[i])` of `files[i]`; O(n log n).

    Ranges that touch or overlap always merge. Across a gap, a range joins the current read
    only if the gap is at most `max_gap`, the read stays within `max_merged` bytes, and it
    stays within `max_amplification` times the bytes the ranges in it need. A range longer
    than `max_merged` is read on its own and never split.
    """
    files, starts, ends = _ranges(files, starts, ends, "files, starts and ends")
    n = len(files)
    if max_gap < 0 or max_merged <= 0 or max_amplification < 1:
        raise ValueError("max_gap must be >= 0, max_merged > 0, max_amplification >= 1")
    order = np.lexsort((ends, starts, files))
    f, s, e = files[order].tolist(), starts[order].tolist(), ends[order].tolist()
    read_file: list[int] = []
    read_start: list[int] = []
    read_end: list[int] = []
    item_read = np.empty(n, dtype=np.int64)
    cur_file, cur_start, cur_end, useful = -1, 0, 0, 0
    for k in range(n):
        fk, sk, ek = f[k], s[k], e[k]
        new_end = max(ek, cur_end)
        adds = new_end - max(sk, cur_end) if ek > cur_end else 0
        joins = fk == cur_file and (
            sk <= cur_end
            or (sk - cur_end <= max_gap
                and new_end - cur_start <= max_merged
                and new_end - cur_start <= max_amplification * (useful + adds))
        )
        if joins:
            cur_end, useful = new_end, useful + adds
        else:
            if read_file:
                read_end.append(cur_end)
            read_file.append(fk)
            read_start.append(sk)
            cur_file, cur_start, cur_end, useful = fk, sk, ek, ek - sk
        item_read[order[k]] = len(read_file) - 1
    if n:
        read_end.append(cur_end)
    rs = np.asarray(read_start, dtype=np.int64)
    return ReadPlan(
        read_file=np.asarray(read_file, dtype=np.int64),
        read_start=rs,
        read_end=np.asarray(read_end, dtype=np.int64),
        item_read=item_read,
        item_offset=starts - rs[item_read] if n else np.zeros(0, dtype=np.int64),
        item_length=ends - starts,
    )


@dataclass(frozen=True, slots=True)
class Runs:
    """Consecutive whole chunks of one file cut into runs of about `target` bytes.

    Run r is global chunks `[chunk[r], chunk[r+1])`, all in file `file[r]`, bytes
    `[start[r], end[r])` of that file. The same cut serves the block shuffle (a block is a
    run: records that lie together are read together) and the segment tiers (a segment is a
    run: a record never straddles two segments, whatever the group size).
    """

    chunk: np.ndarray  # R + 1 boundaries in global chunk numbers
    file: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.file)


def cut_runs(chunk_file, chunk_start, chunk_end, target: int) -> Runs:
    """Cut the global chunk table (chunks in file order, each file's chunks in byte order)
    into runs: a run never crosses a file, and closes at the first chunk that brings it to
    `target` bytes or more (so a chunk larger than `target` is a run of its own). O(chunks),
    vectorized per file by prefix sums; pure."""
    if target <= 0:
        raise ValueError(f"run target must be positive, got {target}")
    f, s, e = _ranges(chunk_file, chunk_start, chunk_end, "chunk_file, chunk_start and chunk_end")
    n = len(f)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Runs(np.zeros(1, dtype=np.int64), z, z, z)
    if (np.diff(f) < 0).any():
        raise ValueError("chunks must be in file order")
    bounds = [0]
    file_starts = np.flatnonzero(np.diff(f)) + 1
    for a, b in zip([0, *file_starts.tolist()], [*file_starts.tolist(), n]):
        # Run closes after chunk k when the bytes since the run's first chunk reach target:
        # greedy over a prefix sum, one searchsorted per run.
        sizes = np.cumsum(e[a:b] - s[a:b])
        base, k = 0, 0
        while k < b - a:
            k = int(np.searchsorted(sizes, base + target, side="left")) + 1
            k = min(k, b - a)
            bounds.append(a + k)
            base = int(sizes[k - 1])
    chunk = np.asarray(bounds, dtype=np.int64)
    first, last = chunk[:-1], chunk[1:] - 1
    return Runs(chunk, f[first], s[first], e[last])


@dataclass(frozen=True)
class ChunkWants:
    """The records that a run of upcoming output positions (horizon `horizon`) wants of
    each multi-record chunk it touches: chunk c is `(names[file[c]], start[c])` (the
    original file and offset, whatever copy the workers read) and wants the sorted,
    distinct record numbers `within[offsets[c]:offsets[c + 1]]`; `first[c]` is a record of
    it in the refs the wants were worked out of. One worker pulls them all out of the chunk
    at once, for every task of the horizon (`workers.extract`)."""

    horizon: int
    names: list[str]
    file: np.ndarray
    start: np.ndarray
    offsets: np.ndarray
    within: np.ndarray
    count: np.ndarray  # the footer's record count of each chunk
    first: np.ndarray

    def of(self, name: str, start: int) -> np.ndarray:
        """The record numbers wanted of the chunk at `start` of `name` (maybe none)."""
        index = self.__dict__.get("_index")
        if index is None:
            index = {(self.names[f], s): c for c, (f, s) in
                     enumerate(zip(self.file.tolist(), self.start.tolist()))}
            object.__setattr__(self, "_index", index)
        c = index.get((name, start))
        if c is None:
            return self.within[:0]
        return self.within[self.offsets[c] : self.offsets[c + 1]]

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_index"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def chunk_wants(refs: ChunkRefs, horizon: int) -> ChunkWants:
    """What the records `refs` want of each chunk holding several records, as `ChunkWants`."""
    multi = np.flatnonzero(refs.count > 1) if refs.count is not None else \
        np.zeros(0, np.int64)
    f, s, w = refs.file[multi], refs.start[multi], refs.within[multi]
    n = refs.count[multi] if refs.count is not None else multi
    order = np.lexsort((w, s, f))
    f, s, w, n, at = f[order], s[order], w[order], n[order], multi[order]
    if len(w):
        new = np.ones(len(w), dtype=bool)
        new[1:] = (f[1:] != f[:-1]) | (s[1:] != s[:-1]) | (w[1:] != w[:-1])
        f, s, w, n, at = f[new], s[new], w[new], n[new], at[new]
    first = np.ones(len(w), dtype=bool)
    first[1:] = (f[1:] != f[:-1]) | (s[1:] != s[:-1])
    heads = np.flatnonzero(first)
    offsets = np.append(heads, len(w)).astype(np.int64)
    names = [refs.name(i) for i in range(len(refs.paths))]
    return ChunkWants(horizon, names, f[heads].astype(np.int64), s[heads].astype(np.int64),
                      offsets, w.astype(np.int32), n[heads].astype(np.int64),
                      at[heads].astype(np.int64))
