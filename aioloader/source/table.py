"""Locating records: the opened files, their footer indices, and one table of every chunk.

A `RecordTable` (built by `opening.open_table`) is what the rest of the source asks "where
is record i?": file numbers (a file's place in `urls`) are the ids every later stage uses;
URLs are only for reading and for errors. It fetches nothing after opening.

Each file has a record format (`formats`, `aioloader.formats`): the table does not care
which, as every format's index is a chunk table; the chunk refs it hands out carry each
record's format code, which the workers decode by.

A file opened by a read instruction (`path[start:end]`) is indexed whole; the table then
numbers only its records start..end-1 (`ranges`). Chunks, runs and `locate` stay in the
files' own numbering, so nothing below the table knows of it; the record boundaries the
table hands out (`chunk_starts`, `run_record_starts`) are mapped into the records it
numbers, and a chunk or run outside every range becomes an empty one.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import formats as fmts
from ..arrayrecord import FileIndex
from ..index.planning import ChunkRefs, Runs, cut_runs
from ..io.storage import ObjectInfo, is_local, redact


class _Chunks:
    """Every chunk of every file in one table, so a batch is located with one search.

    Lean for millions of chunks (the whole table is about 12 bytes per group_size-1 record):
    `bounds` holds each file's chunk offsets followed by its footer offset, so chunk g of
    file f starts at `bounds[g + f]` and ends at `bounds[g + f + 1]` (a chunk's range runs
    to the next chunk or the footer, as `FileIndex.chunk_ends` says), and the files' own
    `chunk_offsets` / `chunk_ends` are rebound as views of it; a chunk's file is a search
    over `first_chunk`; when every chunk holds one record (group_size 1), chunk g is record
    g and no record table is kept.
    """

    def __init__(self, indices: Sequence[FileIndex], starts: np.ndarray,
                 bounds: np.ndarray | None = None) -> None:
        counts = np.array([ix.num_chunks for ix in indices], dtype=np.int64)
        self.first_chunk = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_chunks = int(self.first_chunk[-1])
        if bounds is None and len(indices) == 1:  # one file: its own, when it has them
            bounds = indices[0].bounds
        self.shared = bounds is not None  # the indices are views of it already (mapped)
        if bounds is None:
            bounds = np.empty(self.num_chunks + len(indices), dtype=np.int64)
            for f, ix in enumerate(indices):
                lo = int(self.first_chunk[f]) + f
                bounds[lo : lo + ix.num_chunks] = ix.chunk_offsets
                bounds[lo + ix.num_chunks] = ix.footer_offset
        elif len(bounds) != self.num_chunks + len(indices):
            raise ValueError("bounds do not hold the files' chunks")
        self.bounds = bounds
        self.one_record_chunks = all(ix.one_record_chunks for ix in indices)
        # Global index of each chunk's first record, plus the total (None: chunk g is record g).
        self.record_starts: np.ndarray | None = None
        if not self.one_record_chunks:
            rs = np.empty(self.num_chunks + 1, dtype=np.int64)
            rs[0] = 0
            for f, ix in enumerate(indices):
                lo = int(self.first_chunk[f])
                np.cumsum(ix.chunk_records, out=rs[lo + 1 : lo + 1 + ix.num_chunks])
                rs[lo + 1 : lo + 1 + ix.num_chunks] += starts[f]
            self.record_starts = rs

    def rebind(self, indices: Sequence[FileIndex]) -> list[FileIndex]:
        """The files' indices with their chunk offsets and ends as views of `bounds`."""
        if self.shared:
            return list(indices)
        out = []
        for f, ix in enumerate(indices):
            lo = int(self.first_chunk[f]) + f
            out.append(ix.with_bounds(self.bounds[lo : lo + ix.num_chunks + 1], check=False))
        return out

    def record_start(self, g: np.ndarray) -> np.ndarray:
        """Global index of the first record of chunks `g` (g may be num_chunks: the total)."""
        return g if self.record_starts is None else self.record_starts[g]

    def file_of(self, g: np.ndarray) -> np.ndarray:
        """The file each of the global chunks `g` lies in."""
        return np.searchsorted(self.first_chunk, g, side="right") - 1

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file, start, end) of every chunk as arrays (built on demand: 24 bytes a chunk)."""
        sizes = np.diff(self.first_chunk)
        file = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        g = np.arange(self.num_chunks, dtype=np.int64) + file
        return file, self.bounds[g], self.bounds[g + 1]


class RecordTable:
    """The opened files (numbered in order) and where each global record lies in them."""

    def __init__(self, files: list[ObjectInfo], indices: list[FileIndex],
                 bounds: np.ndarray | None = None, *,
                 ranges: Sequence[tuple[int, int] | None] | None = None,
                 formats: Sequence[str] | None = None) -> None:
        """`bounds`, when given, is the table of chunk boundaries the indices are already
        views of (an index cache's mapped entry: see `_Chunks`). `ranges[f]`, when given and
        not None, is the records `[start, end)` of file f the table numbers (a read
        instruction); ValueError if it runs past the file's end. `formats[f]` is file f's
        record format (`aioloader.formats`; default ArrayRecord)."""
        self.files = files
        self.formats = list(formats) if formats is not None else \
            [fmts.ARRAYRECORD] * len(files)
        if len(self.formats) != len(files):
            raise ValueError("formats must name one format per file")
        # Each file's format code, for the chunk refs of tasks (None: all ArrayRecord).
        self._codes: np.ndarray | None = None
        if any(k != fmts.ARRAYRECORD for k in self.formats):
            self._codes = np.array([fmts.code(k) for k in self.formats], dtype=np.uint8)
        counts = np.array([ix.num_records for ix in indices], dtype=np.int64)
        whole = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.urls = [f.url for f in files]
        self._chunks = _Chunks(indices, whole, bounds)
        # Files' records as the table numbers them (`starts`), and where each file's first
        # numbered record lies among all the files' records (`_base`; None: all numbered).
        self.starts = whole
        self._whole = whole
        self._base: np.ndarray | None = None
        if ranges is not None and any(r is not None for r in ranges):
            lo = np.array([0 if r is None else r[0] for r in ranges], dtype=np.int64)
            hi = np.array([n if r is None else r[1] for r, n in zip(ranges, counts.tolist())],
                          dtype=np.int64)
            bad = np.flatnonzero((lo < 0) | (lo > hi) | (hi > counts))
            if bad.size:
                f = int(bad[0])
                raise ValueError(
                    f"{redact(self.urls[f])}[{lo[f]}:{hi[f]}]: the read instruction asks "
                    f"for records {lo[f]}..{hi[f] - 1}, but the file holds {counts[f]} "
                    f"(records 0..{counts[f] - 1}); fix the range or the file name")
            self._base = whole[:-1] + lo
            self.starts = np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int64)
        self.indices = self._chunks.rebind(indices)
        # Files with chunks of more than one record (counted, not the writer's group_size,
        # as `max_group_size` is): a chunk may be needed again for another of its records,
        # so the fetch stage caches their raw chunks, and `read` their decoded records.
        self.grouped = np.array([ix.max_records > 1 for ix in self.indices], dtype=bool)
        self._runs: dict[int, Runs] = {}
        self.pattern_files: list[int] | None = None  # files each opened pattern named
        self.from_index_cache = False  # the indices are an index cache entry's
        # What decoding processes key the files' contexts by (with each file's number):
        # this table's, never another's (`workers.contexts`).
        self.token = secrets.token_hex(8)
        self._states: dict[int, Any] = {}  # this process's decoding state of each file

    def __len__(self) -> int:
        return int(self.starts[-1])

    def contexts(self, files: Sequence[int]) -> dict[int, bytes]:
        """The contexts (`FileIndex.context`) of files `files` (numbers in the table)."""
        return {int(f): self.indices[int(f)].context for f in files}

    def state(self, f: int, max_decoded: int) -> Any:
        """File f's decoding state in this process (`RecordFormat.prepare`, once), or None
        for a format that needs none (the user-facing reads decode with it)."""
        state = self._states.get(f)
        if state is None:
            fmt = fmts.get(self.formats[f])
            if not fmt.contextual:
                return None
            state = self._states[f] = fmt.prepare(self.indices[f].context,
                                                  path=self.indices[f].path,
                                                  max_decoded=max_decoded)
        return state

    @property
    def first_records(self) -> np.ndarray:
        """Each file's first record that the table numbers, in the file's own numbering
        (its read instruction's start; 0 for a file read whole)."""
        if self._base is None:
            return np.zeros(len(self.files), dtype=np.int64)
        return self._base - self._whole[:-1]

    @property
    def pattern_records(self) -> tuple[int, ...]:
        """Records of each pattern the table was opened with, in order (a mix's inputs are
        runs of patterns); the files' counts when the patterns are not known."""
        files = self.pattern_files or [1] * len(self.files)
        ends = self.starts[np.cumsum([0, *files])]
        return tuple(int(x) for x in np.diff(ends))

    @property
    def chunk_count(self) -> int:
        """Chunks in all files."""
        return self._chunks.num_chunks

    @property
    def chunk_starts(self) -> np.ndarray:
        """Global index of the first record of every chunk of every file, plus the total
        (for group_size 1 files, built on each call: it is `arange`)."""
        t = self._chunks
        if t.record_starts is None:
            return self._numbered(np.arange(t.num_chunks + 1, dtype=np.int64))
        return self._numbered(t.record_starts)

    def _numbered(self, at: np.ndarray) -> np.ndarray:
        """Record boundaries among all the files' records (non-decreasing) -> the same
        boundaries among the records the table numbers (see `ranges`)."""
        if self._base is None:
            return at
        f = np.clip(np.searchsorted(self._whole, at, side="right") - 1, 0, len(self.files) - 1)
        return self.starts[f] + np.clip(at - self._base[f], 0, np.diff(self.starts)[f])

    def _all_records(self, idx: np.ndarray) -> np.ndarray:
        """Records as the table numbers them (in range) -> their places among all the
        files' records."""
        if self._base is None:
            return idx
        f = np.searchsorted(self.starts, idx, side="right") - 1
        return self._base[f] + idx - self.starts[f]

    def runs(self, target: int) -> Runs:
        """Every file cut into runs of whole chunks of about `target` bytes (see
        `planning.cut_runs`): the blocks of the block shuffle and the segments of the cache
        tiers. Computed once per target."""
        runs = self._runs.get(target)
        if runs is None:
            runs = self._runs[target] = cut_runs(*self._chunks.columns(), target)
        return runs

    def run_record_starts(self, target: int) -> np.ndarray:
        """Global index of the first record of each run, plus the total (prefix sums)."""
        return self._numbered(self._chunks.record_start(self.runs(target).chunk))

    def blocks(self, target: int) -> tuple[np.ndarray, np.ndarray]:
        """The block shuffle's blocks (runs of about `target` bytes on disk): their record
        starts, and their decoded bytes (what a window holds in memory)."""
        decoded = np.concatenate([ix.chunk_decoded_sizes for ix in self.indices]
                                 or [np.zeros(0, np.int64)]).astype(np.int64)
        first = self.runs(target).chunk[:-1]
        sizes = np.add.reduceat(decoded, first) if first.size else np.zeros(0, np.int64)
        return self.run_record_starts(target), sizes

    @property
    def max_group_size(self) -> int:
        """The most records any chunk holds (1: every record is its own chunk)."""
        return max(max(ix.max_records, 1) for ix in self.indices) if self.indices else 1

    @property
    def all_local(self) -> bool:
        return all(is_local(u) for u in self.urls)

    def _chunks_of(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Global record indices → (global chunk, index within chunk), vectorized."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"record {bad} out of range: the source has {n} records")
        idx = self._all_records(idx)
        rs = self._chunks.record_starts
        if rs is None:  # group_size 1 everywhere: chunk g holds record g
            return idx, np.zeros_like(idx)
        g = np.searchsorted(rs, idx, side="right") - 1
        return g, idx - rs[g]

    def locate_one(self, index: int) -> tuple[int, int, int]:
        """`locate` of one record (0 <= index < len), as Python ints: scalar lookups, not
        array passes (`src[i]` one record at a time)."""
        n = len(self)
        if not 0 <= index < n:
            raise IndexError(f"record {index} out of range: the source has {n} records")
        if self._base is not None:
            f = int(self.starts.searchsorted(index, "right")) - 1
            index = int(self._base[f]) + index - int(self.starts[f])
        t = self._chunks
        rs = t.record_starts
        g = index if rs is None else int(rs.searchsorted(index, "right")) - 1
        first = t.first_chunk
        f = 0 if len(first) == 2 else int(first.searchsorted(g, "right")) - 1
        return f, g - int(first[f]), 0 if rs is None else index - int(rs[g])

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global record indices → (file, chunk, index within chunk), vectorized."""
        g, within = self._chunks_of(indices)
        t = self._chunks
        files = t.file_of(g)
        return files, g - t.first_chunk[files], within

    def chunk_refs(self, indices) -> ChunkRefs:
        """Where each record's chunk lies: what a worker needs to read and decode it, and
        the file numbers the fetch stage reads it by."""
        g, within = self._chunks_of(indices)
        t = self._chunks
        files = t.file_of(g)
        used, local_file = np.unique(files, return_inverse=True)
        u = used.tolist()
        at = g + files
        count = (np.ones_like(g) if t.record_starts is None else
                 t.record_starts[g + 1] - t.record_starts[g])
        return ChunkRefs(paths=[self.urls[f] for f in u], file=local_file.astype(np.int64),
                         chunk=g - t.first_chunk[files], start=t.bounds[at],
                         end=t.bounds[at + 1], within=within, count=count,
                         names=[self.indices[f].path for f in u], ids=used.astype(np.int64),
                         format=None if self._codes is None else self._codes[files])
