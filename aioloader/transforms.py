"""Record and batch transforms: what map / random_map / filter / batch / pack mean (pure).

The operations are picklable descriptions that run wherever the loader puts them: in a
worker process, or inline. Randomness never depends on where or when a record is processed:
`random_map` gets a generator keyed on (seed, epoch, record index, op position), so results
are identical for any worker count, prefetch depth or retry.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class TransformError(RuntimeError):
    """A user transform raised; the message names the op, the record and the cause."""


@dataclass(frozen=True)
class MapOp:
    fn: Callable[[Any], Any]

    def describe(self) -> str:
        return f"map({_name(self.fn)})"


@dataclass(frozen=True)
class RandomMapOp:
    fn: Callable[[Any, np.random.Generator], Any]
    seed: int = 0

    def describe(self) -> str:
        return f"random_map({_name(self.fn)})"


@dataclass(frozen=True)
class FilterOp:
    pred: Callable[[Any], bool]

    def describe(self) -> str:
        return f"filter({_name(self.pred)})"


@dataclass(frozen=True)
class BatchOp:
    size: int
    drop_remainder: bool = False

    def describe(self) -> str:
        return f"batch({self.size}{', drop_remainder' if self.drop_remainder else ''})"


@dataclass(frozen=True)
class PackOp:
    length_struct: Mapping[str, int]
    num_packing_bins: int

    def describe(self) -> str:
        return f"pack({dict(self.length_struct)}, bins={self.num_packing_bins})"


RecordOp = MapOp | RandomMapOp | FilterOp


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def record_rng(seed: int, epoch: int, index: int, op_position: int) -> np.random.Generator:
    """The generator `random_map` op `op_position` gets for record `index` in `epoch`.

    Philox is counter-based: the counter's low word advances as numbers are drawn, and the
    high words hold (index, epoch, op), so every record has its own non-overlapping stream.
    """
    counter = [0, index, epoch, op_position]
    return np.random.Generator(np.random.Philox(key=seed % 2**128, counter=counter))


def apply_record_ops(ops: Sequence[RecordOp], elements: list, indices: Sequence[int],
                     epochs: Sequence[int], paths: Sequence[str] | None = None) -> list:
    """Run the record ops over a batch of elements, op by op; filtered ones are dropped.

    `indices`/`epochs` key `random_map`'s generators; `paths` (each record's file) only go
    into error messages. One loop per op keeps the per-record cost to the user's function.
    """
    keep = list(range(len(elements)))  # positions (in the input) of the surviving elements
    for pos, op in enumerate(ops):
        k = 0
        out: list = []
        append = out.append
        try:
            if isinstance(op, MapOp):
                fn = op.fn
                for k, x in enumerate(elements):  # noqa: B007 (k names the record on error)
                    append(fn(x))
            elif isinstance(op, RandomMapOp):
                fn, seed = op.fn, op.seed
                for k, x in enumerate(elements):
                    i = keep[k]
                    append(fn(x, record_rng(seed, epochs[i], indices[i], pos)))
            else:
                pred = op.pred
                kept = []
                for k, x in enumerate(elements):
                    if pred(x):
                        append(x)
                        kept.append(keep[k])
                keep = kept
        except Exception as exc:
            i = keep[k]
            where = f" in {paths[i]}" if paths and paths[i] else ""
            raise TransformError(
                f"{op.describe()} raised {type(exc).__name__}: {exc} on record {indices[i]} "
                f"(epoch {epochs[i]}){where}\n--- original traceback ---\n"
                + "".join(traceback.format_exception(exc))
            ) from None
        elements = out
    return elements


def collate(elements: Sequence[Any], path: str = "element",
            alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray | None] | None = None
            ) -> Any:
    """Stack a list of same-structured elements into one batch (dicts, tuples, arrays).

    Numbers and arrays become stacked NumPy arrays; bytes and str stay lists. `alloc(shape,
    dtype)` may supply the memory a stacked array is written into (None: allocate).
    """
    first = elements[0]
    if isinstance(first, Mapping):
        return {k: collate([e[k] for e in elements], f"{path}[{k!r}]", alloc) for k in first}
    if isinstance(first, tuple) and not hasattr(first, "_fields"):
        return tuple(collate([e[i] for e in elements], f"{path}[{i}]", alloc)
                     for i in range(len(first)))
    if isinstance(first, (bytes, str, bytearray, memoryview)):
        return [bytes(e) if isinstance(e, memoryview) else e for e in elements]
    if type(first) in (int, float, bool):  # Python numbers (e.g. from JSON): one C loop
        try:
            stacked = np.array(elements)
        except ValueError:  # mixed with sequences: the general path explains
            stacked = np.empty(0, dtype=object)
        if stacked.ndim == 1 and stacked.dtype != object:
            out = alloc(stacked.shape, stacked.dtype) if alloc is not None else None
            if out is None:
                return stacked
            out[...] = stacked
            return out
    arrays = [np.asarray(e) for e in elements]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(
            f"batch() needs {path} to have one shape, got {sorted(shapes)[:4]}: pad or trim "
            "it in a map() before batch(), or use pack() for variable-length sequences"
        )
    out = None
    if alloc is not None:
        out = alloc((len(arrays), *arrays[0].shape), np.result_type(*{a.dtype for a in arrays}))
    return np.stack(arrays) if out is None else np.stack(arrays, out=out)


def apply_batch_ops(ops: Sequence[MapOp], batch: Any) -> Any:
    for op in ops:
        try:
            batch = op.fn(batch)
        except Exception as exc:
            raise TransformError(
                f"{op.describe()} (after batch) raised {type(exc).__name__}: {exc}\n"
                "--- original traceback ---\n" + "".join(traceback.format_exception(exc))
            ) from None
    return batch
