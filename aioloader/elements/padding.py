"""Padding ragged leaves of a batch (pure): what `batch(pad=...)` and `bucket_by_length`
mean, and how one leaf is padded.

`batch(n, pad=...)` names which leaves of an element are padded along their first axis, and
to what length: to the longest in the batch (`True`) or to a fixed length (an int), for the
whole element or per field (a dict for dict elements, a tuple for tuple elements, nested as
the element is). `pad_value` gives the value the padding holds, one for all or per field in
the same shape (default 0), and `truncate=True` cuts an element longer than its fixed
length instead of refusing it. This is tf.data's `padded_batch` (its `padded_shapes` and
`padding_values`), for the first axis only: trailing axes must agree, as for `batch()`.
`pad_value` is Grain's name for the value; Grain's own `batch_and_pad` pads the other axis,
the batch's (a short last batch filled up to the batch size: `to_jax(pad_final=...)` here).

Unlike tf.data, every padded field of a dict gets a mask beside it, `name + "_mask"`: a
bool array `(batch, length)`, True where the element has data. JAX has no ragged arrays,
so a model needs it, and a suffix beside the field reads as pack()'s `_segment_ids` do
(`batch["tokens_mask"]`). A padded leaf with no name (a tuple's item, a bare array) cannot
carry one: `masks=False` pads it without, or make the element a dict.

`pad_rules` turns the arguments into a tree of `PadRule` leaves (checked once, where the
pipeline is built); `child` walks it beside the element; `pad_leaf` pads one leaf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CollateError

MASK_SUFFIX = "_mask"


@dataclass(frozen=True)
class PadRule:
    """How the array leaves under one place of the element are padded: to `length` (None:
    the longest in the batch) with `value`; `truncate`: cut longer ones to `length`."""

    length: int | None
    value: Any = 0
    truncate: bool = False


@dataclass(frozen=True)
class Fields:
    """Rules per key (a dict's) or per index (a tuple's); `rest` for the others."""

    children: tuple[tuple[Any, Rule], ...]
    rest: Rule = None

    def get(self, key: Any) -> Rule:
        for k, rule in self.children:
            if k == key:
                return rule
        return self.rest


Rule = PadRule | Fields | None


def child(rule: Rule, key: Any) -> Rule:
    """The rule of `key` (a dict key or tuple index) under `rule`."""
    if rule is None or isinstance(rule, PadRule):
        return rule
    return rule.get(key)


def named(rule: Rule) -> list:
    """The keys `rule` names explicitly (each must be in the element)."""
    return [k for k, _ in rule.children] if isinstance(rule, Fields) else []


def pad_rules(pad: Any, pad_value: Any = 0, truncate: bool = False, where: str = "batch"
              ) -> Rule:
    """The rule tree of `pad`, `pad_value` and `truncate` (`where`: the verb, for errors),
    or None when nothing is padded. A `ValueError`/`TypeError` naming the argument and the
    field for anything that does not fit."""
    rules = _merge(pad, pad_value, truncate, where, "pad", "pad_value")
    if rules is None and not (isinstance(pad_value, (int, float)) and pad_value == 0):
        raise ValueError(f"{where}() pad_value={pad_value!r} is given, but pad= pads nothing: "
                         "give pad=True (or lengths) too")
    if truncate and not _has_fixed(rules):
        raise ValueError(f"{where}(truncate=True) cuts elements to a fixed length, but pad= "
                         f"gives none: give a length (pad={{'tokens': 128}}) or drop truncate")
    return rules


def pads_to_longest(rule: Rule) -> bool:
    """Whether `rule` pads some leaf to the longest in its batch (a shape that varies)."""
    if isinstance(rule, PadRule):
        return rule.length is None
    if isinstance(rule, Fields):
        return pads_to_longest(rule.rest) or any(pads_to_longest(r) for _, r in rule.children)
    return False


def _has_fixed(rule: Rule) -> bool:
    if isinstance(rule, PadRule):
        return rule.length is not None
    if isinstance(rule, Fields):
        return _has_fixed(rule.rest) or any(_has_fixed(r) for _, r in rule.children)
    return False


def _merge(pad: Any, value: Any, truncate: bool, where: str, ppath: str, vpath: str) -> Rule:
    if isinstance(pad, np.bool_):
        pad = bool(pad)
    if isinstance(value, (Mapping, tuple, list)):
        if isinstance(pad, (Mapping, tuple, list)):
            keys = _keys(pad, ppath, where)
            vkeys = _keys(value, vpath, where)
            if isinstance(value, Mapping) != isinstance(pad, Mapping):
                raise TypeError(f"{where}() {vpath} is a {type(value).__name__} but {ppath} "
                                f"a {type(pad).__name__}: give both in the element's shape")
            for k in vkeys:
                if k not in keys:
                    raise ValueError(f"{where}() {vpath}[{k!r}] is given, but {ppath} does not "
                                     f"pad {k!r}: add it to {ppath}, or drop it")
                given, padded = _at(value, k), _at(pad, k)
                if (padded is None or padded is False or padded is np.False_) and not (
                        isinstance(given, (int, float)) and given == 0):
                    raise ValueError(f"{where}() {vpath}[{k!r}] = {given!r} is given, but "
                                     f"{ppath}[{k!r}] is {padded!r}, so nothing there is "
                                     f"padded: pad it in {ppath}, or drop its pad_value")
            return _fields([(k, _merge(_at(pad, k), _at(value, k, 0), truncate, where,
                                       f"{ppath}[{k!r}]", f"{vpath}[{k!r}]")) for k in keys])
        if pad is None or pad is False:
            raise ValueError(f"{where}() {vpath} is given, but {ppath} pads nothing there: "
                             f"give {ppath}=True (or lengths) too")
        leaf = _leaf(pad, 0, truncate, where, ppath)
        keys = _keys(value, vpath, where)
        return Fields(tuple((k, _merge(pad, _at(value, k), truncate, where, ppath,
                                       f"{vpath}[{k!r}]")) for k in keys), leaf)
    if isinstance(pad, (Mapping, tuple, list)):
        keys = _keys(pad, ppath, where)
        return _fields([(k, _merge(_at(pad, k), value, truncate, where, f"{ppath}[{k!r}]",
                                   vpath)) for k in keys])
    if pad is None or pad is False:
        return None
    return _leaf(pad, value, truncate, where, ppath)


def _fields(children: list[tuple[Any, Rule]]) -> Rule:
    kept = tuple((k, r) for k, r in children if r is not None)
    return Fields(kept) if kept else None


def _keys(spec: Any, path: str, where: str) -> list:
    if isinstance(spec, Mapping):
        if not spec:
            raise ValueError(f"{where}() {path} is an empty dict: name the fields to pad")
        return list(spec)
    return list(range(len(spec)))


def _at(spec: Any, key: Any, default: Any = None) -> Any:
    if isinstance(spec, Mapping):
        return spec.get(key, default)
    return spec[key] if key < len(spec) else default


def _leaf(pad: Any, value: Any, truncate: bool, where: str, path: str) -> PadRule:
    if pad is True:
        length = None
    elif isinstance(pad, (bool, np.bool_)) or not isinstance(pad, (int, np.integer)):
        raise TypeError(f"{where}() {path} must be True (pad to the longest in the batch), "
                        f"a length (int), False/None (not padded), or a dict/tuple of them "
                        f"per field, got {pad!r} ({type(pad).__name__})")
    elif pad < 1:
        raise ValueError(f"{where}() {path} = {pad} is not a length: give one >= 1, or True "
                         "to pad to the longest in the batch")
    else:
        length = int(pad)
    if isinstance(value, (bool, np.bool_)):
        value = bool(value)
    elif isinstance(value, (int, float, np.integer, np.floating)):
        value = value.item() if isinstance(value, np.generic) else value
    else:
        raise TypeError(f"{where}() pad_value for {path} must be a number or a bool, got "
                        f"{value!r} ({type(value).__name__})")
    return PadRule(length, value, bool(truncate))


def describe(pad: Any, pad_value: Any, truncate: bool, masks: bool) -> str:
    """The padding arguments as a verb's description shows them ("" for none)."""
    if pad is None or pad is False:
        return ""
    out = f", pad={_show(pad)}"
    if not (isinstance(pad_value, (int, float)) and pad_value == 0):
        out += f", pad_value={_show(pad_value)}"
    return out + (", truncate" if truncate else "") + ("" if masks else ", masks=False")


def _show(spec: Any) -> str:
    """`spec` as text, a dict's keys sorted (their order changes nothing)."""
    if isinstance(spec, Mapping):
        return "{" + ", ".join(f"{k!r}: {_show(spec[k])}" for k in sorted(spec, key=repr)) + "}"
    if isinstance(spec, (tuple, list)):
        return repr(type(spec)(_Shown(_show(v)) for v in spec))
    return repr(spec)


class _Shown(str):
    """Text that shows as itself inside a tuple's repr."""

    def __repr__(self) -> str:
        return str(self)


def pad_leaf(arrays: Sequence[np.ndarray], path: str, rule: PadRule,
             alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray | None] | None = None,
             verb: str = "batch") -> tuple[np.ndarray, np.ndarray]:
    """Arrays of one leaf (ndim >= 1) padded along their first axis into one `(n, length,
    *trailing)` array, and the mask `(n, length)`; a `CollateError` naming `path` and the
    element that does not fit (another trailing shape or kind of dtype, longer than a fixed
    length without `truncate`, a pad value its dtype cannot hold)."""
    lengths = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
    full = [a for a in arrays if len(a)] or [arrays[0]]  # empty ones: no data, no say
    trailing, kind = full[0].shape[1:], full[0].dtype.kind in "USO"
    for a in full:
        if a.shape[1:] != trailing or (a.dtype.kind in "USO") != kind:
            k = next(i for i, b in enumerate(arrays) if b is a)
            what = (f"trailing shape {a.shape[1:]}, element 0's {trailing}"
                    if a.shape[1:] != trailing else f"dtype {a.dtype}, not {full[0].dtype}")
            raise CollateError(f"{verb}(pad=) pads {path} along its first axis only, and element "
                               f"{k} has {what}: make them agree in a map() before batching",
                               k)
    if kind:
        raise CollateError(f"{verb}(pad=) pads numbers, and {path} is {full[0].dtype}: leave "
                           "it out of pad=, or encode it as numbers in a map()", 0)
    longest = int(lengths.max(initial=0))
    length = longest if rule.length is None else rule.length
    if longest > length and not rule.truncate:
        k = int(np.argmax(lengths))
        raise CollateError(f"{verb}(pad=) pads {path} to {length}, but element {k} has "
                           f"{longest}: raise the length in pad=, or pass truncate=True to "
                           "cut longer elements", k)
    dtype = np.result_type(*(a.dtype for a in full))
    fill = _fill_value(rule.value, dtype, path, verb)
    n = len(arrays)
    out = alloc((n, length, *trailing), dtype) if alloc is not None else None
    if out is None:
        out = np.empty((n, length, *trailing), dtype)
    mask = alloc((n, length), np.dtype(bool)) if alloc is not None else None
    if mask is None:
        mask = np.empty((n, length), bool)
    kept = np.minimum(lengths, length)
    np.less(np.arange(length), kept[:, None], out=mask)
    if longest == length and bool(mask.all()):
        np.stack(arrays, out=out)  # (nothing to pad: one copy)
        return out, mask
    out[...] = fill
    pieces = [a[:length] if len(a) > length else a for a in arrays if len(a)]
    if pieces:  # every element's data in one copy, each row to its slots (one scatter)
        total = int(kept.sum())
        starts = np.cumsum(kept) - kept
        slots = np.arange(total) + np.repeat(np.arange(n) * length - starts, kept)
        out.reshape(n * length, *trailing)[slots] = np.concatenate(pieces)
    return out, mask


def _fill_value(value: Any, dtype: np.dtype, path: str, verb: str) -> np.ndarray:
    """`value` as a `dtype` scalar, or a `CollateError` if `dtype` cannot hold it."""
    with np.errstate(all="ignore"):
        try:
            cast = np.array(value).astype(dtype)
        except (OverflowError, ValueError, TypeError):
            cast = None
    if cast is None or not _holds(cast.item(), value, dtype):
        raise CollateError(f"{verb}(pad=) pads {path} ({dtype}) with pad_value={value!r}, "
                           f"which {dtype} cannot hold" + (f" (it would be {cast.item()!r})"
                                                         if cast is not None else "")
                           + ": give a pad_value for it that it can")
    return cast  # type: ignore[return-value]


def _holds(got: Any, value: Any, dtype: np.dtype) -> bool:
    """Whether `got`, `value` cast to `dtype` and back, is `value`: exactly, or for a float
    with a fraction (0.1) into a float dtype, rounded to the nearest it has (not to 0, not
    past its range). Python compares ints and floats exactly, so 2**24 + 1 in float32 fails."""
    if got == value or (got != got and value != value):
        return True
    if type(value) is not float or dtype.kind != "f" or value.is_integer() or \
            not math.isfinite(value) or type(got) is not float or not math.isfinite(got):
        return False
    info = np.finfo(dtype)
    return abs(value) >= float(info.tiny) and abs(got - value) <= abs(value) * float(info.eps)
