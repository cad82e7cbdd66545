"""`FileIndex`: where every chunk of one ArrayRecord file lies, kept lean for millions of chunks.

What opening a file (`index.open_index`) produces and everything after it reads: chunk
offsets, record counts and decoded sizes as columns, with the derived views (chunk ends,
record starts) computed on first use. `compact_counts` / `compact_sizes` are the narrowing
that keeps a group_size-1 file at ~12 bytes per record.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .options import WriterOptions, parse_options


@dataclass(frozen=True, eq=False)
class FileIndex:
    """Where every chunk of one file is, and how many records each holds.

    Kept lean, since millions of chunks are common (group_size 1): an all-ones
    `chunk_records` is a read-only broadcast (no memory per chunk; see `compact_counts`),
    decoded sizes are uint32 when they fit, and `chunk_ends` / `record_starts` are derived
    on first use. The source's `RecordTable` rebinds `chunk_offsets` and `chunk_ends` as views
    of its one table of every file's chunk boundaries (`with_bounds`), so nothing is kept twice.
    """

    path: str | None
    size: int
    footer_offset: int
    chunk_offsets: np.ndarray  # int64, one per data chunk
    chunk_records: np.ndarray  # int64 (a broadcast when every chunk holds one record)
    chunk_decoded_sizes: np.ndarray  # int64 or uint32
    writer_options: str
    element_spec: str = ""  # aioloader's element spec (JSON), if the writer recorded one
    # What decoding this file's chunks needs besides their bytes, opaque here: its record
    # format fills and reads it (`aioloader.formats`; a Parquet file's footer). Empty for
    # formats whose chunks describe themselves.
    context: bytes = b""

    @cached_property
    def chunk_ends(self) -> np.ndarray:
        """Physical end of each chunk's range (the next chunk, or the footer)."""
        bounds = self.bounds
        if bounds is not None:
            return bounds[1:]
        return np.append(self.chunk_offsets[1:], self.footer_offset).astype(np.int64)

    @property
    def bounds(self) -> np.ndarray | None:
        """The chunk offsets followed by the footer offset, when `chunk_offsets` is a prefix
        view of such an array (as the footer decoder builds them): that array, shared, not
        copied; else None."""
        offsets, n = self.chunk_offsets, self.num_chunks
        base = offsets.base
        if (not isinstance(base, np.ndarray) or base.ndim != 1 or base.dtype != np.int64 or
                len(base) != n + 1 or not base.flags.c_contiguous or
                offsets.dtype != np.int64 or offsets.strides != (8,) or
                offsets.ctypes.data != base.ctypes.data or base[n] != self.footer_offset):
            return None
        return base

    @cached_property
    def record_starts(self) -> np.ndarray:
        """First record of each chunk, plus the total at the end."""
        out = np.zeros(len(self.chunk_records) + 1, dtype=np.int64)
        np.cumsum(self.chunk_records, out=out[1:])
        return out

    @cached_property
    def num_records(self) -> int:
        return int(self.chunk_records.sum(dtype=np.int64)) if self.num_chunks else 0

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_offsets)

    @cached_property
    def max_records(self) -> int:
        """The most records one chunk holds (0 for a file without chunks)."""
        return int(self.chunk_records.max()) if self.num_chunks else 0

    @cached_property
    def one_record_chunks(self) -> bool:
        """Every chunk holds exactly one record (group_size 1): chunk c is record c."""
        return self.num_chunks == self.num_records and self.max_records <= 1

    def with_bounds(self, bounds: np.ndarray, *, check: bool = True) -> FileIndex:
        """This index with `chunk_offsets` and `chunk_ends` as views of `bounds` (its chunk
        offsets followed by its footer offset, equal to its own: checked, unless the caller
        has just copied them there, `check=False`)."""
        n = self.num_chunks
        if check and (len(bounds) != n + 1 or bounds[n] != self.footer_offset or
                      not np.array_equal(bounds[:n], self.chunk_offsets)):
            raise ValueError("bounds are not this index's chunk offsets and footer offset")
        # (the fields and what is known, copied as they are: one dict update, not the frozen
        # `__init__`'s setattr per field; a table of thousands of small files makes one each)
        out = object.__new__(FileIndex)
        known = {k: v for k, v in vars(self).items() if k in _COPIED}
        vars(out).update(known, chunk_offsets=bounds[:n], chunk_ends=bounds[1:],
                         num_records=self.num_records)
        return out

    @cached_property
    def options(self) -> WriterOptions | None:
        """Parsed writer options, or None for files written without them (before 2022)."""
        try:
            return parse_options(self.writer_options) if self.writer_options else None
        except ValueError:
            return None

    @property
    def group_size(self) -> int:
        if self.options is not None:
            return self.options.group_size
        return int(self.chunk_records[0]) if self.num_chunks else 1

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Map record indices to (chunk, index within chunk), vectorized."""
        idx = np.asarray(indices, dtype=np.int64)
        n = self.num_records
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"{self.path or 'file'}: record {bad} out of range [0, {n})")
        if self.one_record_chunks:
            return idx, np.zeros_like(idx)
        chunks = np.searchsorted(self.record_starts, idx, side="right") - 1
        return chunks, idx - self.record_starts[chunks]

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """The physical byte range `[start, end)` that holds chunk `chunk`."""
        return int(self.chunk_offsets[chunk]), int(self.chunk_ends[chunk])


_KEPT = frozenset({"max_records", "one_record_chunks", "options"})  # what `with_bounds` carries
_COPIED = _KEPT | {"path", "size", "footer_offset", "chunk_records", "chunk_decoded_sizes",
                   "writer_options", "element_spec", "context"}  # and its fields, but the offsets

_ONE = np.ones(1, dtype=np.int64)
_ONE.flags.writeable = False


def ones_like(counts: np.ndarray) -> np.ndarray:
    """A read-only broadcast of 1 in the shape of `counts` (no memory per chunk)."""
    return np.ndarray(counts.shape, np.int64, _ONE, 0, (0,))


def compact_counts(counts: np.ndarray) -> np.ndarray:
    """Record counts, as a read-only broadcast of 1 when every chunk holds one record."""
    if len(counts) and counts.strides != (0,) and counts.min() == 1 and counts.max() == 1:
        return ones_like(counts)
    return counts


def compact_sizes(sizes: np.ndarray) -> np.ndarray:
    """Decoded chunk sizes, as uint32 when they fit (half the memory)."""
    if len(sizes) and sizes.dtype != np.uint32 and np.minimum.reduce(sizes) >= 0 and \
            np.maximum.reduce(sizes) < 1 << 32:
        return sizes.astype(np.uint32)
    return sizes

