"""Random access into a pipeline: `len(ds)`, `ds[i]`, `ds[[i, j]]` (what Grain's MapDataset
gives a notebook user who wants to look at the data).

The element at output position i is computed in this process the way the loader computes
it: the same compiled plan maps i to (record, epoch), the record is read through an
`ArrayRecordSource`, and the same record ops run on it, random_map keyed on (seed, epoch,
record, op position). So `ds[i]` is the loader's i-th element, for any worker count. Only
pipelines whose ops are all one-to-one can be indexed: a filter, flat_map, pack or batch makes the
position of an element depend on the elements before it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..describe.mixed import opened
from ..describe.objects import ObjectRecords, ObjectSource
from ..describe.plan import compile, needs_processes, source_meta
from ..elements.transforms import FilterOp, FlatMapOp, apply_record_ops
from ..index.dataslices import unknown_layout_error
from ..options import LoaderOptions
from ..source import ArrayRecordSource

if TYPE_CHECKING:
    from ..describe.dataset import Dataset


def unindexable(dataset: Dataset) -> str | None:
    """Why `dataset` has no random access, or None when it has."""
    if any(isinstance(op, FilterOp) for op in dataset.record_ops):
        return "a filter() drops elements, so position i depends on every element before it"
    if any(isinstance(op, FlatMapOp) for op in dataset.record_ops):
        return ("a flat_map() makes any number of elements of a record, so position i "
                "depends on every element before it")
    if dataset.batching is not None:
        verb = dataset.batching.describe().split("(")[0] + "()"
        return (f"{verb} groups elements; index the pipeline before it (the loader yields "
                "its batches)")
    return None


class Access:
    """The opened files and compiled plan of one dataset, for reading elements by position."""

    def __init__(self, dataset: Dataset) -> None:
        why = unindexable(dataset)
        if why is not None:
            raise TypeError(f"this Dataset cannot be indexed: {why}")
        procs = None
        if needs_processes(dataset):
            from ..jax import process_index_and_count, process_shard

            procs = process_shard(dataset)
            if procs is None:
                raise unknown_layout_error(process_index_and_count()[1])
        spec = opened(dataset.source)  # a mix's inputs: one source, end to end
        self.source: ArrayRecordSource | ObjectRecords
        if isinstance(spec, ObjectSource):  # a from_source() object: read in place
            self.source = ObjectRecords(spec)
        else:
            self.source = ArrayRecordSource(list(spec.paths),
                                            storage_options=spec.storage_options,
                                            verify=spec.verify, resident_bytes=0,
                                            format=spec.format)
        # Run when the dataset is freed, in whatever thread the collector ran: not waited for.
        self._finalizer = weakref.finalize(self, _close_soon, self.source)
        meta = source_meta(self.source, spec.verify, whole=False)
        plan = compile(dataset, meta, LoaderOptions(), procs=procs)
        self.index = plan.index
        self.ops = plan.record_ops
        self.length = plan.index.length

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("this Dataset repeats forever: it has no len(); slice it "
                            "(ds[:n]) for a finite one")
        return self.length

    def get(self, positions: Sequence[int]) -> list[Any]:
        """The elements at `positions` (negative ones count from the end)."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if (pos < 0).any():
            pos = np.where(pos < 0, pos + len(self), pos)
        if len(pos) == 0:
            return []
        if self.length is not None and ((pos < 0) | (pos >= self.length)).any():
            bad = int(positions[int(np.flatnonzero((pos < 0) | (pos >= self.length))[0])])
            raise IndexError(f"position {bad} is out of range: this Dataset has {self.length} "
                             "elements (Grain's datasets wrap a position past the end into "
                             "the next epoch; here ds.repeat()[i] does that)")
        records, epochs = self.index.lookup(pos)
        raw = self.source[records]
        return apply_record_ops(self.ops, raw, records.tolist(), epochs.tolist())

    def close(self) -> None:
        self._finalizer()


def _close_soon(source: ArrayRecordSource | ObjectRecords) -> None:
    if isinstance(source, ArrayRecordSource):
        source.close(wait=False)
    else:
        source.close()


_OPEN: dict[int, Access] = {}  # one Access per live Dataset object (its files stay open)


def access_of(dataset: Dataset) -> Access:
    """The `Access` of `dataset`, opened on first use and closed with the dataset."""
    found = _OPEN.get(id(dataset))
    if found is None:
        found = _OPEN[id(dataset)] = Access(dataset)
        weakref.finalize(dataset, _forget, id(dataset))
    return found


def _forget(key: int) -> None:
    found = _OPEN.pop(key, None)
    if found is not None:
        found.close()
