"""The stash (`workers.extract`) for formats whose records the workers do not pull out of a
chunk's bytes themselves, as they do ArrayRecord's: their format decodes the chunk and gives
the wanted records as bytes (`RecordFormat.stash_records`: a Parquet row group's rows), laid
out in the chunk's region of the stash as an ArrayRecord entry is; a task reads them back
(`RecordFormat.from_stash`) where its horizon's entries hold them, and decodes the rest as
it would without a stash.

This is what makes workers help where a chunk's decode costs far more than its records'
copy (`RecordFormat.stash_shared`): under an exact shuffle every task wants rows of nearly
every row group, so each worker would otherwise decode the whole dataset for itself. With
the stash each row group is decoded once per horizon, by one worker, whatever the count.
The records are the same either way (the format's own bytes of them), so the output does
not depend on which tasks found theirs in the stash.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..index.planning import ChunkRefs
from .extract import HEAD, lay_out, read_entry
from .messages import Fill, StashRef


def fill(fmt: Any, refs: ChunkRefs, raw: Any, state: Any, job: Fill, region: memoryview, *,
         name: str, verify: str, max_decoded: int) -> int:
    """A fill job of format `fmt`: records `job.wanted` of the chunk of `refs`' first record
    (its bytes `raw`, its file's `state`) into `region`; how many went in (a prefix)."""
    if job.size < HEAD + 8:
        return 0
    wanted = np.asarray(job.wanted, dtype=np.int64)
    records = fmt.stash_records(raw, int(refs.start[0]), wanted.tolist(), verify=verify,
                                path=name, chunk=int(refs.chunk[0]),
                                expected_records=None if refs.count is None
                                else int(refs.count[0]),
                                max_decoded=max_decoded, state=state)
    return len(lay_out(records, wanted, into=region)[0])


class StashIndex:
    """What one decoding process read of the current horizon's entries: per chunk, its
    records' numbers and their bytes' places in the stash file, as Python lists (a record
    is then found by a bisection, with no NumPy call per chunk and task). Kept while the
    horizon (`StashRef.serial`) is the same: its entries are not rewritten meanwhile. It
    takes about 80 bytes a record of the horizon (two ints), a few percent of the stash
    for rows of a KiB."""

    def __init__(self) -> None:
        self._serial: tuple[str, int] | None = None
        self._chunks: dict[tuple[str, int], tuple[list[int], list[int]] | None] = {}

    def chunk(self, stash: StashRef, key: tuple[str, int], view: memoryview
              ) -> tuple[list[int], list[int]] | None:
        """(sorted record numbers, their bytes' bounds in the file: n + 1 of them) of the
        entry of chunk `key`, or None where the horizon has none."""
        serial = (stash.path, stash.serial)
        if stash.serial >= 0 and serial != self._serial:  # (a new horizon: its entries)
            self._serial, self._chunks = serial, {}
        if stash.serial >= 0 and key in self._chunks:
            return self._chunks[key]
        at = stash.at.get(key)
        got = None
        if at is not None:
            have, offs, _ = read_entry(view[at[0] : at[0] + at[1]])
            base = at[0] + HEAD + 16 * len(have) + 8  # (where `read_entry` finds the data)
            got = (have.tolist(), (offs + base).tolist())
        if stash.serial >= 0:
            self._chunks[key] = got
        return got


def from_stash(fmt: Any, refs: ChunkRefs, names: Sequence[str], stash: StashRef,
               view: memoryview, index: StashIndex) -> tuple[list[Any], np.ndarray]:
    """Each record of `refs` that the horizon's entries hold, by `fmt.from_stash` (None in
    the others' places), and the places of the others, which the task decodes itself."""
    out: list[Any] = [None] * len(refs)
    missing: list[int] = []
    entries: dict[tuple[str, int], tuple[list[int], list[int]] | None] = {}
    take = fmt.from_stash
    for k, (f, s, w) in enumerate(zip(refs.file.tolist(), refs.start.tolist(),
                                      refs.within.tolist())):
        key = (names[f], s)
        if key in entries:
            entry = entries[key]
        else:
            entry = entries[key] = index.chunk(stash, key, view)
        if entry is not None:
            have, bounds = entry
            j = bisect.bisect_left(have, w)
            if j < len(have) and have[j] == w:
                out[k] = take(view[bounds[j] : bounds[j + 1]])
                continue
        missing.append(k)
    return out, np.asarray(missing, dtype=np.int64)
