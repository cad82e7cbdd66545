"""Where a byte of a file lies among a table's runs (`planning.Runs`: runs of whole chunks,
in file order, byte order within a file): one search over every file's runs at once, a
(file, offset) keyed as one ascending number. Both tiers cut the files into the same runs
and look ranges up here (a loop over files cost microseconds a record in the parent).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..index.planning import Runs


class RunIndex:
    """The runs `runs` of files of `sizes` bytes: run r is bytes `[start[r], end[r])` of
    file `file[r]`."""

    def __init__(self, sizes: Sequence[int] | np.ndarray, runs: Runs) -> None:
        self.file = np.asarray(runs.file, dtype=np.int64)
        self.start = np.asarray(runs.start, dtype=np.int64)
        self.end = np.asarray(runs.end, dtype=np.int64)
        # File f's byte b is key base[f] + b (a file's end, too, keys before the next file).
        room = np.asarray(sizes, dtype=np.int64) + 1
        self._base = np.concatenate([[0], np.cumsum(room)[:-1]]).astype(np.int64)
        self._key = self._base[self.file] + self.start

    def __len__(self) -> int:
        return len(self.file)

    def of(self, files: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
        """The run each range `[starts[i], ends[i])` of file `files[i]` lies in; None if one
        lies in none (not a chunk's range)."""
        if not len(self.file):
            return None if len(files) else np.zeros(0, dtype=np.int64)
        run = np.searchsorted(self._key, self._base[files] + starts, side="right") - 1
        r = np.maximum(run, 0)
        ok = (run >= 0) & (self.file[r] == files) & (ends <= self.end[r])
        return run if bool(ok.all()) else None
