"""Stacking a batch's elements into arrays (`collate`), with errors that name the field and
the element that does not fit (pure). The batch step of every path runs it: in a worker
(straight into its shared-memory slot, through `alloc`), inline, or in the stream packer.
With `pad` rules (`aioloader.elements.padding`) ragged leaves are padded as they are
stacked, in the same pass, and dict fields get their masks beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from ..errors import CollateError
from .padding import MASK_SUFFIX, PadRule, Rule, child, named, pad_leaf

__all__ = ["CollateError", "collate", "collate_named"]

Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray | None]


def collate(elements: Sequence[Any], path: str = "element", alloc: Alloc | None = None,
            pad: Rule = None, masks: bool = True, verb: str = "batch") -> Any:
    """Stack a list of same-structured elements into one batch (dicts, tuples, arrays).

    Numbers and arrays become stacked NumPy arrays; bytes and str stay lists. `alloc(shape,
    dtype)` may supply the memory a stacked array is written into (None: allocate). `pad`:
    which leaves are padded, and how (`padding.pad_rules`); `masks`: each padded field of a
    dict gets `name + "_mask"` beside it; `verb`: the step that batches, for errors.
    """
    if pad is not None:
        got = _padded(elements, path, alloc, pad, masks, verb)
        return _unnamed(got, path, masks, verb)
    first = elements[0]
    # Equal sizes, then indexing that fails: only then is the structure diagnosed (checking
    # every element's keys up front would cost time on every record). Same size and every
    # key of the first present means the same keys, so nothing is silently dropped.
    if isinstance(first, Mapping):
        try:
            if len(set(map(len, elements))) > 1:
                raise KeyError
            return {k: collate(list(map(itemgetter(k), elements)), f"{path}[{k!r}]", alloc,
                               verb=verb)
                    for k in first}
        except (KeyError, TypeError, IndexError):
            _same_structure(elements, path, Mapping, list, "keys", verb)
            raise
    if isinstance(first, tuple) and not hasattr(first, "_fields"):
        try:
            if len(set(map(len, elements))) > 1:
                raise IndexError
            return tuple(collate([e[i] for e in elements], f"{path}[{i}]", alloc,
                                 verb=verb)
                         for i in range(len(first)))
        except (KeyError, TypeError, IndexError):
            _same_structure(elements, path, tuple, len, "length", verb)
            raise
    if isinstance(first, (bytes, str, bytearray, memoryview)):
        if memoryview not in set(map(type, elements)):  # (one C loop: a column of text)
            return list(elements)
        return [bytes(e) if isinstance(e, memoryview) else e for e in elements]
    return _stack(elements, path, alloc, verb)


def _stack(elements: Sequence[Any], path: str,
           alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray | None] | None,
           verb: str = "batch") -> np.ndarray:
    """Numbers or arrays (one leaf of the structure) stacked into one array, of one shape
    and of numbers or of strings but not both, else a CollateError naming the element."""
    first = elements[0]
    if type(first) in (int, float, bool):  # Python numbers (e.g. from JSON): one C loop
        try:
            stacked = np.array(elements)
        except ValueError:  # mixed with sequences: the general path explains
            stacked = np.empty(0, dtype=object)
        if stacked.ndim == 1 and stacked.dtype.kind not in "OUS":
            out = alloc(stacked.shape, stacked.dtype) if alloc is not None else None
            if out is None:
                return stacked
            out[...] = stacked
            return out
    arrays = [np.asarray(e) for e in elements]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        k = next(i for i, a in enumerate(arrays) if a.shape != arrays[0].shape)
        raise CollateError(
            f"{verb}() needs {path} to have one shape, got {sorted(shapes)[:4]} (element {k} "
            f"has {arrays[k].shape}, element 0 {arrays[0].shape}): pad or trim it in a map() "
            f"before {verb}(), or use pack() for variable-length sequences", k)
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1 and len({d.kind in "US" for d in dtypes}) > 1:
        # numbers and strings mixed: numpy would silently make them all strings
        text = arrays[0].dtype.kind in "US"
        k = next(i for i, a in enumerate(arrays) if (a.dtype.kind in "US") != text)
        raise CollateError(
            f"{verb}() got {path} of mixed types: element 0 is {arrays[0].dtype} and element "
            f"{k} is {arrays[k].dtype}; convert it to one type in a map() before {verb}()", k)
    out = None
    if alloc is not None:
        out = alloc((len(arrays), *arrays[0].shape), np.result_type(*dtypes))
    return np.stack(arrays) if out is None else np.stack(arrays, out=out)


def collate_named(elements: Sequence[Any], name: Callable[[int], str],
                  alloc: Alloc | None = None, pad: Rule = None, masks: bool = True,
                  verb: str = "batch") -> Any:
    """`collate`, with a `CollateError` that also says which record the offending element
    is (`name(k)` describes element k: its record index and file, say)."""
    try:
        return collate(elements, alloc=alloc, pad=pad, masks=masks, verb=verb)
    except CollateError as exc:
        if exc.element is None:
            raise
        raise CollateError(f"{exc} [element {exc.element} is {name(exc.element)}]",
                           exc.element) from None


def _same_structure(elements: Sequence[Any], path: str, kind: type,
                    shape: Callable[[Any], Any], what: str, verb: str = "batch") -> None:
    """Every element is a `kind` with the first one's keys (or length), or a CollateError
    naming the field and the first element that differs."""
    want = shape(elements[0])
    for k, e in enumerate(elements):
        if not isinstance(e, kind):
            raise CollateError(f"{verb}() got {path} of mixed types: element 0 is "
                               f"{type(elements[0]).__name__}, element {k} is "
                               f"{type(e).__name__}", k)
        got = shape(e)
        if got != want:
            detail = (f"missing {sorted(map(repr, set(want) - set(got)))}, extra "
                      f"{sorted(map(repr, set(got) - set(want)))}" if what == "keys"
                      else f"{got}, not {want}")
            raise CollateError(f"{verb}() needs every {path} to have the same {what}: element "
                               f"{k} differs from element 0 ({detail}); make them agree in a "
                               f"map() before {verb}()", k)


class _Padded:
    """A padded leaf on its way up to the dict that names its mask."""

    __slots__ = ("data", "mask")

    def __init__(self, data: np.ndarray, mask: np.ndarray) -> None:
        self.data, self.mask = data, mask


def _unnamed(got: Any, path: str, masks: bool, verb: str = "batch") -> Any:
    """A collated value that is not a dict's field: a padded leaf has no name for a mask."""
    if not isinstance(got, _Padded):
        return got
    if masks:
        raise CollateError(f"{verb}(pad=) pads {path}, which is not a field of a dict, so its "
                           "mask has no name: make the element a dict in a map() (the mask "
                           "is then name + '_mask'), or pass masks=False", 0)
    return got.data


def _padded(elements: Sequence[Any], path: str, alloc: Alloc | None, rule: Rule,
            masks: bool, verb: str = "batch") -> Any:
    """`collate` under a pad rule: the same structure checks and errors, padded leaves as
    `_Padded` (their parent dict adds the masks)."""
    if rule is None:
        return collate(elements, path, alloc, verb=verb)
    first = elements[0]
    for k in named(rule):
        has = k in first if isinstance(first, Mapping) else (
            isinstance(first, tuple) and isinstance(k, int) and k < len(first))
        if not has:
            raise CollateError(f"{verb}(pad=) names {path}[{k!r}], which element 0 does not "
                               "have: check the names in pad= and pad_value=", 0)
    if isinstance(first, Mapping):
        try:
            if len(set(map(len, elements))) > 1:
                raise KeyError
            columns = {k: [e[k] for e in elements] for k in first}
        except (KeyError, TypeError, IndexError):
            _same_structure(elements, path, Mapping, list, "keys", verb)
            raise
        out: dict = {}
        for k, column in columns.items():
            got = _padded(column, f"{path}[{k!r}]", alloc, child(rule, k), masks, verb)
            if not isinstance(got, _Padded):
                out[k] = got
                continue
            out[k] = got.data
            if masks:
                name = f"{k}{MASK_SUFFIX}" if isinstance(k, str) else None
                if name is None or name in first:
                    raise CollateError(
                        f"{verb}(pad=) adds a mask for {path}[{k!r}] as "
                        f"{name!r}, which " + ("the element already has" if name else
                                               "needs a str key") +
                        ": rename the field in a map(), or pass masks=False", 0)
                out[name] = got.mask
        return out
    if isinstance(first, tuple) and not hasattr(first, "_fields"):
        try:
            if len(set(map(len, elements))) > 1:
                raise IndexError
            columns_t = [[e[i] for e in elements] for i in range(len(first))]
        except (KeyError, TypeError, IndexError):
            _same_structure(elements, path, tuple, len, "length", verb)
            raise
        return tuple(_unnamed(_padded(c, f"{path}[{i}]", alloc, child(rule, i), masks, verb),
                              f"{path}[{i}]", masks, verb) for i, c in enumerate(columns_t))
    if isinstance(first, (bytes, str, bytearray, memoryview)) or not isinstance(rule, PadRule):
        return collate(elements, path, alloc, verb=verb)
    arrays = [np.asarray(e) for e in elements]
    ndims = {a.ndim for a in arrays}
    if ndims == {0} or len(ndims) > 1:  # scalars batch as before; mixed ranks are explained
        return _stack(elements, path, alloc, verb)
    return _Padded(*pad_leaf(arrays, path, rule, alloc, verb))
