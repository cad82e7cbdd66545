"""Records of the formats other than ArrayRecord, in the process that runs the task: each
format decodes its own chunks (`decode_records`, `formats.base`), read here from local files
once per distinct chunk (`ChunkReads`) or fetched; a stashable format's records come from its
horizon's entries where they are there (`workers.formatstash`), and its fill jobs lay them
out. The `Decoder` (`workers.decode`) sends a task's records of such a format here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from .. import formats as fmts
from ..index.planning import ChunkRefs
from . import formatstash
from .chunkcache import chunk_keys
from .contexts import FileStates
from .localfiles import LocalFiles
from .messages import Fill, StashRef


class Reader(Protocol):
    """What these reads use of the decoding process's `Decoder`."""

    files: LocalFiles
    states: FileStates
    stash_index: formatstash.StashIndex
    table: str  # the task's table token: what `states` are keyed by
    decoded: int
    missed: int

    def view(self, path: str) -> memoryview: ...


def records(dec: Reader, refs: ChunkRefs, raws: Sequence | None, verify: str,
            max_decoded: int, paths: Sequence[str] | None,
            stash: StashRef | None) -> list[Any]:
    """Records of one format's chunks by its `decode_records` (local files read here)."""
    fmt = fmts.by_code(int(refs.format[0]))  # type: ignore[index]  # set for these
    if stash is not None and fmt.stashable:
        return _stashed(dec, fmt, refs, raws, verify, max_decoded, paths, stash)
    states = None
    if fmt.contextual:
        states = dec.states.of(refs, dec.table)
        if any(s is None for s in states):
            raise ValueError("a task's records decode by files' contexts this process "
                             "was not given (`FileStates.lacking` not asked)")
    if raws is None:
        raws = dec.files.read(refs) if chunk_keys(refs) is None else ChunkReads(dec, refs)
    names = list(paths) if paths is not None else \
        [refs.name(f) for f in refs.file.tolist()]
    return fmt.decode_records(raws, refs.start.tolist(), refs.within.tolist(),
                              verify=verify, paths=names, chunks=refs.chunk.tolist(),
                              counts=None if refs.count is None else refs.count.tolist(),
                              max_decoded=max_decoded, states=states)


def _stashed(dec: Reader, fmt: Any, refs: ChunkRefs, raws: Sequence | None, verify: str,
             max_decoded: int, paths: Sequence[str] | None, stash: StashRef) -> list[Any]:
    """Records of a stashable format from the horizon's entries; those the entries lack,
    decoded as without a stash (`workers.formatstash`)."""
    names = [refs.name(f) for f in range(len(refs.paths))]
    out, rest = formatstash.from_stash(fmt, refs, names, stash, dec.view(stash.path),
                                       dec.stash_index)
    dec.missed += len(rest)
    if len(rest):
        r = rest.tolist()
        # (the chunks decoded for this task alone, or found kept: counted as decoded)
        dec.decoded += len(set(zip(refs.file[rest].tolist(), refs.start[rest].tolist())))
        got = records(dec, refs.pick(rest), None if raws is None else [raws[i] for i in r],
                      verify, max_decoded, None if paths is None else [paths[i] for i in r],
                      None)
        for i, record in zip(r, got):
            out[i] = record
    return out


def fill(dec: Reader, fmt: Any, refs: ChunkRefs, raws: Sequence | None, job: Fill,
         region: memoryview, names: list[str], verify: str, max_decoded: int,
         table: str) -> int:
    """A fill job of a format that decodes its chunks itself (`workers.formatstash`)."""
    state = None
    if fmt.contextual:
        state = dec.states.of(refs, table)[0]
        if state is None:
            raise ValueError("a fill job's chunk decodes by its file's context, which "
                             "this process was not given")
    raw = raws[0] if raws is not None else \
        dec.files.read(refs.pick(np.zeros(1, dtype=np.int64)))[0]
    dec.decoded += 1
    return formatstash.fill(fmt, refs, raw, state, job, region,
                            name=names[int(refs.file[0])], verify=verify,
                            max_decoded=max_decoded)


class ChunkReads(Sequence):
    """The bytes of each record's chunk (`refs`) of local files, read when first asked for
    and once per distinct chunk: a format that keeps its decoded chunks (Parquet's row
    groups) asks only for those it lacks."""

    def __init__(self, dec: Reader, refs: ChunkRefs) -> None:
        self._files, self._refs = dec.files, refs
        self._keys = list(zip(refs.file.tolist(), refs.start.tolist()))
        self._read: dict[tuple[int, int], Any] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i):  # type: ignore[override]  # (ints only)
        key = self._keys[i]
        raw = self._read.get(key)
        if raw is None:
            one = self._refs.pick(np.asarray([i], dtype=np.int64))
            raw = self._read[key] = self._files.read(one)[0]
        return raw
