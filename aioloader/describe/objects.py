"""Records of any random-access object (`Dataset.from_source`): a Grain data source, a list.

The loader's own path reads ArrayRecord files: it plans byte ranges, fetches them and decodes
chunks in the workers. An object with `__len__` and `__getitem__` has none of that: its
records are whatever `obj[i]` returns. So the smallest honest path is taken: every decoding
process holds the object itself (the workers get a pickled copy when the pool starts, with
cloudpickle, like the transforms; `workers=0` uses it in place) and reads its records by
global index, `obj.__getitems__(indices)` when it has one (Grain's ArrayRecordDataSource
does), else `obj[i]` one by one. The parent only schedules: no bytes are planned, fetched or
cached for it. So the object must pickle, and a list's records travel with it to each
worker: fine for a Grain source (which pickles its paths and reopens) or a small list,
wasteful for a large list in memory (write it to ArrayRecord files instead).

`ObjectRecords` is what the runtime and random access see in place of an
`ArrayRecordSource`: the record count, and chunk refs that only name the source (a task's
record indices say what to read).
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from ..arrayrecord.levels import DEFAULT_VERIFY
from ..errors import TransformError
from ..index.planning import ChunkRefs


@dataclass(frozen=True, eq=False)
class ObjectSource:
    """The description of an object source (compared by identity: the object is the data)."""

    obj: Any
    # SourceSpec's fields, for code that reads them
    storage_options: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    verify = DEFAULT_VERIFY

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectSource) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    @property
    def name(self) -> str:
        return f"<{type(self.obj).__qualname__}>"

    @property
    def paths(self) -> tuple[str, ...]:
        """What descriptions and states call it (there are no files)."""
        return (self.name,)


def check_source(obj: Any) -> None:
    """A TypeError unless `obj` looks like a random-access source of records."""
    if isinstance(obj, (str, bytes, bytearray)):
        raise TypeError(f"Dataset.from_source() takes an object of records, not a "
                        f"{type(obj).__name__}: for ArrayRecord files by path, use "
                        "Dataset.from_arrayrecord()")
    missing = [m for m in ("__len__", "__getitem__") if not hasattr(obj, m)]
    if missing:
        raise TypeError(f"Dataset.from_source() needs an object with __len__ and __getitem__ "
                        f"(a Grain data source, a list of records); {type(obj).__qualname__} "
                        f"has no {' or '.join(missing)}")


def read_records(obj: Any, indices: Sequence[int]) -> list[Any]:
    """Records `indices` of `obj`, in that order (one `__getitems__` call when it has one).

    The source is the user's code, like a transform: what it raises comes as a
    `TransformError` naming the source and the record (the records, for `__getitems__`).
    """
    indices = [int(i) for i in indices]
    name = type(obj).__qualname__
    getitems = getattr(obj, "__getitems__", None)
    k = -1
    try:
        if getitems is not None:
            out = list(getitems(indices))
            if len(out) != len(indices):
                raise ValueError(f"__getitems__ returned {len(out)} records for "
                                 f"{len(indices)} indices")
            return out
        out = []
        for k, i in enumerate(indices):  # noqa: B007 (k names the record on error)
            out.append(obj[i])
        return out
    except Exception as exc:
        which = (f"record {indices[k]}" if k >= 0 else
                 f"records {indices[:5]}{' ...' if len(indices) > 5 else ''}")
        raise TransformError(
            f"the source <{name}> raised {type(exc).__name__}: {exc} reading {which}\n"
            "--- original traceback ---\n" + "".join(traceback.format_exception(exc))
        ) from None


class ObjectRecords:
    """An object source opened for one loader or one random access (see the module doc)."""

    all_local = True  # the decoding process reads the records itself: no fetch stage
    resident = None
    chunk_starts = None
    storage = None

    def __init__(self, spec: ObjectSource) -> None:
        self.obj = spec.obj
        self.name = spec.name
        self._len = len(spec.obj)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        return read_records(self.obj, np.asarray(indices).tolist())

    def chunk_refs(self, indices: np.ndarray) -> ChunkRefs:
        """Refs that name the source and hold each record's index (the worker reads the
        records by the task's indices; the refs only travel with the task)."""
        indices = np.asarray(indices, dtype=np.int64)
        zeros = np.zeros(len(indices), dtype=np.int64)
        return ChunkRefs([self.name], zeros, indices, zeros, zeros, zeros)

    async def aopen(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass
