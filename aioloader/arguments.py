"""Checking arguments where they are given: one place for "a whole number in range", "a
flag" and "a seed", so that `Dataset`'s verbs and the loader's options refuse a wrong
argument at the call, by the name the user gave it, instead of converting it (`int("8")`,
`int(1.5)`) or failing later in code that never mentions it.

Seeds are the keys of 64-bit permutations and generators: a seed is a whole number in
[0, 2**64). Grain takes [0, 2**32); ours is wider, and nothing outside it is folded in
silently (-1 and 2**64 - 1 would be the same key).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["SEED_LIMIT", "flag", "maybe_seed", "maybe_whole", "seed", "whole"]

SEED_LIMIT = 1 << 64
_SEEDS = " (seeds are 64-bit keys: 0 <= seed < 2**64)"


def whole(value: Any, name: str, lo: int | None = None, *, hi: int | None = None,
          floats: bool = False, extra: str = "", alt: str = "") -> int:
    """`value` as an `int`: a whole number (not a bool, not a string) in `[lo, hi)`; with
    `floats`, a float with an integral value (`1e9`) too. The error names `name`, then
    what else is allowed (`alt`), then why the range is what it is (`extra`)."""
    if floats and isinstance(value, float) and value.is_integer():
        value = int(value)
    kind = getattr(value, "dtype", None)  # a 0-d array or a jax scalar: by its dtype
    if isinstance(value, (bool, np.bool_)) or (kind is not None and kind == np.bool_):
        index = None
    else:
        try:  # any integer, whatever its type (numpy, jax, a 0-d array): what has __index__
            index = operator.index(value)
        except TypeError:
            index = None
    if index is None:
        raise TypeError(f"{name} must be an integer{alt}, got {value!r} "
                        f"({type(value).__name__})")
    value = index
    if (lo is not None and value < lo) or (hi is not None and value >= hi):
        want = f">= {lo}" if hi is None else f"< {hi}" if lo is None else f"in [{lo}, {hi})"
        raise ValueError(f"{name} must be {want}{alt}, got {value}{extra}")
    return value


def maybe_whole(value: Any, name: str, lo: int | None = None, *, hi: int | None = None,
                floats: bool = False, extra: str = "") -> int | None:
    """`whole`, or None for None."""
    if value is None:
        return None
    return whole(value, name, lo, hi=hi, floats=floats, extra=extra, alt=" or None")


def flag(value: Any, name: str) -> bool:
    """`value`, which must be True or False: "no" or 0 is not taken for a flag."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def seed(value: Any, name: str) -> int:
    """A seed: a whole number in [0, 2**64)."""
    return whole(value, name, 0, hi=SEED_LIMIT, extra=_SEEDS)


def maybe_seed(value: Any, name: str) -> int | None:
    """`seed`, or None for None."""
    return maybe_whole(value, name, 0, hi=SEED_LIMIT, extra=_SEEDS)
