"""Where a byte of a file lies among a table's runs (`planning.Runs`: runs of whole chunks,
in file order, byte order within a file): one search over every file's runs at once, a
(file, offset) keyed as one ascending number. Both tiers cut the files into the same runs
and look ranges up here (a loop over files cost microseconds a record in the parent).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..planning import Runs


class RunIndex:
    """The runs `runs` of files of `sizes` bytes: run r is bytes `[start[r], end[r])` of
    file `file[r]`; file f's runs are `first[f]..first[f + 1] - 1`."""

    def __init__(self, sizes: Sequence[int] | np.ndarray, runs: Runs) -> None:
        self.file = np.asarray(runs.file, dtype=np.int64)
        self.start = np.asarray(runs.start, dtype=np.int64)
        self.end = np.asarray(runs.end, dtype=np.int64)
        n = len(sizes)
        counts = np.bincount(self.file, minlength=n) if len(self.file) else \
            np.zeros(n, dtype=np.int64)
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # File f's byte b is key base[f] + b (a file's end, too, keys before the next file).
        room = np.asarray(sizes, dtype=np.int64) + 1
        self._base = np.concatenate([[0], np.cumsum(room)[:-1]]).astype(np.int64)
        self._key = self._base[self.file] + self.start

    def __len__(self) -> int:
        return len(self.file)

    def find(self, files: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The last run that starts at or before byte `starts[i]` of file `files[i]` (-1:
        none); whether it is that file's, and holds the range, is the caller's to check."""
        return np.searchsorted(self._key, self._base[files] + starts, side="right") - 1
