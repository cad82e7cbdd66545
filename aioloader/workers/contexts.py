"""Each file's decoding state in one decoding process, for formats whose chunks do not
describe themselves (`formats.base`: contextual formats, whose files' indices carry a
context; Parquet's is its footer).

A task names a record's file by its number in the source (`ChunkRefs.ids`) and the
opened table by a token (`Task.table`); it carries no context. `FileStates.lacking` says
which of a task's files this process has no state for; the task then comes back once with
the contexts of all its contextual files (`Task.contexts`, `contextual_ids`: the pool may
give it to another process, which lacks others), which `learn` turns into states
(`RecordFormat.prepare`, once per file per process). States are kept least recently used
out, never those of the task at hand, so a process keeps at most `MAX_FILES` of them beyond
one task's, and within a byte bound (a quarter of the memory budget the worker decodes
under): a state is counted as `STATE_PER_CONTEXT_BYTE` times its context's size, as a
parsed footer takes several times its bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import formats as fmts
from ..index.planning import ChunkRefs

MAX_FILES = 4096
STATE_PER_CONTEXT_BYTE = 16  # a prepared state's memory per byte of its context (a bound)


def _contextual(refs: ChunkRefs) -> np.ndarray:
    """The local file numbers (`refs.file`) of the records of contextual formats."""
    if refs.format is None or not len(refs):
        return np.zeros(0, dtype=np.int64)
    codes = [c for c in np.unique(refs.format).tolist() if fmts.by_code(c).contextual]
    if not codes:
        return np.zeros(0, dtype=np.int64)
    return np.unique(refs.file[np.isin(refs.format, codes)])


def contextual_ids(refs: ChunkRefs) -> list[int]:
    """The source's numbers of the files of `refs` that are of contextual formats."""
    files = _contextual(refs)
    if not len(files):
        return []
    if refs.ids is None:
        raise ValueError("records of a contextual format need their files' numbers")
    return [int(i) for i in refs.ids[files].tolist()]


class FileStates:
    """Decoding states by (table token, file number in the source)."""

    def __init__(self, max_files: int = MAX_FILES, max_bytes: int | None = None) -> None:
        self.max_files = max_files
        self.max_bytes = max_bytes  # None: a quarter of `learn`'s `max_decoded`
        self._states: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._costs: dict[tuple[str, int], int] = {}
        self.bytes = 0  # the kept states' costs

    def __len__(self) -> int:
        return len(self._states)

    def lacking(self, refs: ChunkRefs, table: str) -> list[int]:
        """The source's numbers of the files of `refs` whose contexts this process lacks."""
        return [i for i in contextual_ids(refs) if (table, i) not in self._states]

    def learn(self, refs: ChunkRefs, table: str, contexts: Mapping[int, bytes], *,
              max_decoded: int) -> None:
        """States for the files of `refs` that `contexts` (by file number) holds."""
        files = _contextual(refs)
        if not len(files):
            return
        ids = refs.ids  # (set: `lacking` asked first)
        assert ids is not None
        keep = {(table, int(i)) for i in ids[files].tolist()}
        for f in files.tolist():
            key = (table, int(ids[f]))
            context = contexts.get(key[1])
            if key in self._states or context is None:
                continue
            code = int(refs.format[np.flatnonzero(refs.file == f)[0]])  # type: ignore[index]
            self._states[key] = fmts.by_code(code).prepare(context, path=refs.name(f),
                                                           max_decoded=max_decoded)
            self._costs[key] = STATE_PER_CONTEXT_BYTE * len(context)
            self.bytes += self._costs[key]
        max_bytes = max_decoded // 4 if self.max_bytes is None else self.max_bytes
        for k in [k for k in self._states if k not in keep]:  # least recently used first
            if len(self._states) <= self.max_files and self.bytes <= max_bytes:
                break
            del self._states[k]
            self.bytes -= self._costs.pop(k)

    def of(self, refs: ChunkRefs, table: str) -> list[Any]:
        """Each record's file's state (None for files of formats without one)."""
        ids = refs.ids
        if ids is None:
            return [None] * len(refs)
        per_file = []
        for i in ids.tolist():
            state = self._states.get((table, int(i)))
            if state is not None:
                self._states.move_to_end((table, int(i)))
            per_file.append(state)
        return [per_file[f] for f in refs.file.tolist()]
