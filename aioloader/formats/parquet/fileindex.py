"""What the planner keeps of a Parquet file: rows per row group (prefix sums) and, per row
group, the byte ranges to fetch for the selected columns.

A row group plays the role of an ArrayRecord chunk: the unit fetched and decoded whole.
Its selected column chunks are fetched as few ranges as possible: chunks that touch (or
overlap, when an old writer's padding runs into the next) are joined into one range;
chunks with unselected columns between them stay apart, so only the selected columns'
bytes are read. Plain NumPy arrays, so the index pickles small and is cheap to keep for
many files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import ParquetLayout

__all__ = ["ParquetFileIndex", "coalesce"]


def coalesce(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges, sorted and with touching or overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for start, length in sorted(ranges):
        if length <= 0:
            continue
        if out and start <= out[-1][0] + out[-1][1]:
            first, n = out[-1]
            out[-1] = (first, max(first + n, start + length) - first)
        else:
            out.append((start, length))
    return out


@dataclass(frozen=True)
class ParquetFileIndex:
    """Rows and fetch ranges of one Parquet file's row groups, for the selected columns."""

    path: str
    size: int
    row_starts: np.ndarray  #: int64, one per row group and one more: row group g is rows
    #: [row_starts[g], row_starts[g + 1])
    range_starts: np.ndarray  #: int64, one per row group and one more: row group g's
    #: ranges are rows [range_starts[g], range_starts[g + 1]) of `ranges`
    ranges: np.ndarray  #: int64 (n, 2): (offset, length) of each range to fetch

    @classmethod
    def from_layout(cls, layout: ParquetLayout) -> ParquetFileIndex:
        rows = [g.num_rows for g in layout.row_groups]
        per_group = [coalesce([(c.offset, c.length) for c in g.chunks])
                     for g in layout.row_groups]
        flat = [r for group in per_group for r in group]
        return cls(layout.path, layout.size,
                   np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64),
                   np.concatenate([[0], np.cumsum([len(g) for g in per_group],
                                                  dtype=np.int64)]).astype(np.int64),
                   np.asarray(flat, dtype=np.int64).reshape(len(flat), 2))

    @property
    def num_rows(self) -> int:
        return int(self.row_starts[-1])

    @property
    def num_row_groups(self) -> int:
        return len(self.row_starts) - 1

    @property
    def rows_per_group(self) -> np.ndarray:
        return np.diff(self.row_starts)

    def fetch_ranges(self, group: int) -> list[tuple[int, int]]:
        """(offset, length) of each byte range row group `group` needs, ascending."""
        a, b = self.range_starts[group], self.range_starts[group + 1]
        return [(int(o), int(n)) for o, n in self.ranges[a:b]]

    def fetch_bytes(self, group: int) -> int:
        a, b = self.range_starts[group], self.range_starts[group + 1]
        return int(self.ranges[a:b, 1].sum())

    def locate(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """(row group, row within it) of each of the file's `rows`; IndexError outside."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"{self.path}: a row outside [0, {self.num_rows})")
        group = np.searchsorted(self.row_starts, rows, side="right") - 1
        return group, rows - self.row_starts[group]
