"""The stash (`workers.extract`) for formats whose records the workers do not pull out of a
chunk's bytes themselves, as they do ArrayRecord's: their format decodes the chunk and gives
the wanted records as bytes (`RecordFormat.stash_records`: a Parquet row group's rows), laid
out one at a time in the chunk's region of the stash as an ArrayRecord entry is (with what
the records share, such as a schema, kept once as record `HEAD_RECORD`), stopping at the
first that does not fit, so that a fill holds no more than its region; a task reads them back
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
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..index.planning import ChunkRefs
from .extract import HEAD, read_entry
from .messages import Fill, StashRef

_COPY_BYTES = 256 << 10  # records copied into a region this many bytes at a time
HEAD_RECORD = -1  # an entry's head (what its records share) is kept as this record
Held = tuple[list[int], list[int], bytes]  # an entry as `StashIndex` holds it


def fill(fmt: Any, refs: ChunkRefs, raw: Any, state: Any, job: Fill, region: memoryview, *,
         name: str, verify: str, max_decoded: int) -> int:
    """A fill job of format `fmt`: records `job.wanted` of the chunk of `refs`' first record
    (its bytes `raw`, its file's `state`) into `region`; how many went in (a prefix)."""
    if job.size < HEAD + 8:
        return 0
    wanted = np.asarray(job.wanted, dtype=np.int64)
    head, records = fmt.stash_records(raw, int(refs.start[0]), wanted.tolist(), verify=verify,
                                      path=name, chunk=int(refs.chunk[0]),
                                      expected_records=None if refs.count is None
                                      else int(refs.count[0]),
                                      max_decoded=max_decoded, state=state)
    return lay_out_each(head, records, wanted, region)


def lay_out_each(head: bytes, records: Iterable[bytes], wanted: np.ndarray,
                 region: memoryview) -> int:
    """`head` (as record `HEAD_RECORD`) then `records` (record `wanted[k]` is the k-th)
    laid out in `region` as `extract.lay_out` lays an entry out, each copied in as it
    comes, up to the first that does not fit (none after it is made); how many of
    `records` went in.

    The data go in after room for the numbers and offsets of every wanted record, or, in a
    region too small for those, of as many records of 16 bytes as it holds; the data are
    then moved down to follow the numbers and offsets of the records that went in."""
    size = len(region)
    n = len(wanted)
    if HEAD + 16 * (n + 1) + 8 > size:  # (records there is room for, of 16 bytes or more)
        n = max(0, size - HEAD - 24) // 32
    table = HEAD + 16 * (n + 1) + 8  # (numbers and offsets of those and of the head)
    if table + len(head) > size:
        np.frombuffer(region, np.int64, 2)[:] = 0, 0  # (an empty entry)
        return 0
    ends = [len(head)]
    at = table + len(head)
    region[table:at] = head
    pending: list[bytes] = []  # (copied in together: a copy per record costs more)
    since = at
    for record in itertools.islice(records, len(wanted)):
        end = at + len(record)
        if end > size or len(ends) > n:
            break
        pending.append(record)
        at = end
        ends.append(at - table)
        if at - since >= _COPY_BYTES:
            region[since:at] = b"".join(pending)
            pending.clear()
            since = at
    if pending:
        region[since:at] = b"".join(pending)
    k = len(ends)  # (the head and the records that went in)
    data = ends[-1]
    start = HEAD + 16 * k + 8  # (where `read_entry` finds the data of k records)
    if start != table:
        region[start : start + data] = region[table : table + data]  # (memmove: overlaps)
    index = np.frombuffer(region, np.int64, 2 + 2 * k + 1)
    index[:2] = k, data
    index[2] = HEAD_RECORD
    index[3 : 2 + k] = wanted[: k - 1]
    index[2 + k] = 0
    index[3 + k :] = ends
    return k - 1


class StashIndex:
    """What one decoding process read of the current horizon's entries: per chunk, its
    records' numbers and their bytes' places in the stash file, as Python lists (a record
    is then found by a bisection, with no NumPy call per chunk and task). Kept while the
    horizon (`StashRef.serial`) is the same: its entries are not rewritten meanwhile. It
    takes about 80 bytes a record of the horizon (two ints), a few percent of the stash
    for rows of a KiB."""

    def __init__(self) -> None:
        self._serial: tuple[str, int] | None = None
        self._chunks: dict[tuple[str, int], Held | None] = {}

    def chunk(self, stash: StashRef, key: tuple[str, int], view: memoryview) -> Held | None:
        """(sorted record numbers, their bytes' bounds in the file: n + 1 of them, the
        entry's head) of the entry of chunk `key`, or None where the horizon has none."""
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
            numbers, bounds = have.tolist(), (offs + base).tolist()
            head = b""
            if numbers and numbers[0] == HEAD_RECORD:
                head = bytes(view[bounds[0] : bounds[1]])
            got = (numbers, bounds, head)
        if stash.serial >= 0:
            self._chunks[key] = got
        return got


def from_stash(fmt: Any, refs: ChunkRefs, names: Sequence[str], stash: StashRef,
               view: memoryview, index: StashIndex) -> tuple[list[Any], np.ndarray]:
    """Each record of `refs` that the horizon's entries hold, by `fmt.from_stash` (None in
    the others' places), and the places of the others, which the task decodes itself."""
    out: list[Any] = [None] * len(refs)
    missing: list[int] = []
    entries: dict[tuple[str, int], Held | None] = {}
    take = fmt.from_stash
    for k, (f, s, w) in enumerate(zip(refs.file.tolist(), refs.start.tolist(),
                                      refs.within.tolist())):
        key = (names[f], s)
        if key in entries:
            entry = entries[key]
        else:
            entry = entries[key] = index.chunk(stash, key, view)
        if entry is not None:
            have, bounds, head = entry
            j = bisect.bisect_left(have, w)
            if j < len(have) and have[j] == w:
                out[k] = take(view[bounds[j] : bounds[j + 1]], head)
                continue
        missing.append(k)
    return out, np.asarray(missing, dtype=np.int64)
