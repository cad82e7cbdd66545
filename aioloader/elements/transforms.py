"""Record and batch transforms: what map / random_map / filter / flat_map / batch / pack mean
(pure).

The operations are picklable descriptions that run wherever the loader puts them: in a
worker process, or inline. Randomness never depends on where or when a record is processed:
`random_map` gets a generator keyed on (seed, epoch, record index, op position), so results
are identical for any worker count, prefetch depth or retry. After a `flat_map`, the k-th
element one record expands to (counted over every flat_map before the op) keys its own
stream too; without a flat_map, k is 0 and the keys are what they always were.
"""

from __future__ import annotations

import abc
import inspect
import pickle
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np

from ..arguments import flag, seed, whole
from ..errors import TransformError
from .packing import check_pack_config
from .padding import Rule, pad_rules
from .padding import describe as describe_padding


def dumps_op(op: Any) -> bytes:
    """`op` pickled for a worker process: functions a worker can import travel by reference,
    the rest (lambdas, closures, functions of a notebook or `python -c`) by value."""
    return cloudpickle.dumps(op, protocol=pickle.HIGHEST_PROTOCOL)


class Map(abc.ABC):
    """A one-to-one transform as a class (like `grain.transforms.Map`): `.map(Parse())`."""

    @abc.abstractmethod
    def map(self, element: Any) -> Any: ...


class RandomMap(abc.ABC):
    """A random transform as a class (like `grain.transforms.RandomMap`); `rng` is keyed on
    the record, so results do not depend on workers or timing."""

    @abc.abstractmethod
    def random_map(self, element: Any, rng: np.random.Generator) -> Any: ...


class Filter(abc.ABC):
    """A predicate as a class (like `grain.transforms.Filter`): keep when `filter` is true."""

    @abc.abstractmethod
    def filter(self, element: Any) -> bool: ...


class FlatMap(abc.ABC):
    """A one-to-many transform as a class (like Grain's `FlatMapTransform`): `flat_map`
    returns the elements one element becomes (zero or more)."""

    @abc.abstractmethod
    def flat_map(self, element: Any) -> Iterable[Any]: ...


# The arguments each verb calls its function with.
_ARGS = {"map": "(element)", "random_map": "(element, rng)", "filter": "(element)",
         "flat_map": "(element)"}


def transform_fn(obj: Any, method: str, verb: str) -> Callable[..., Any]:
    """What `.{verb}()` calls: `obj`'s `method` when it has one (our base classes, Grain's,
    any object of that shape), else `obj` itself if it is a function. Checked when the
    pipeline is built, so a wrong-shaped transform never waits for the first batch."""
    fn = getattr(obj, method, None)
    if isinstance(obj, type):  # a type is a function (`.map(int)`), unless it is the
        if not callable(fn):   # transform class itself, given for an instance of it
            return _check_arity(obj, verb)
        raise TypeError(f".{verb}() got the class {obj.__qualname__}; pass an instance: "
                        f"{obj.__name__}()")
    if callable(fn):
        return _check_arity(fn, verb)
    if callable(obj):
        return _check_arity(obj, verb)
    has = [m for m in _ARGS if callable(getattr(obj, m, None))]
    what = f"; it has `{has[0]}`: use .{has[0]}()" if has else ""
    raise TypeError(f".{verb}() takes a function or an object with a `{method}` method, got "
                    f"{type(obj).__qualname__}{what}")


def _check_arity(fn: Callable[..., Any], verb: str) -> Callable[..., Any]:
    """`fn`, if its signature takes the verb's arguments (`lambda x: ...` given to
    `.random_map()` is refused here, not at the first batch); a function without a signature
    (some builtins) is trusted."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    try:
        sig.bind(*range(_ARGS[verb].count(",") + 1))
    except TypeError as exc:
        name = _name(fn)
        raise TypeError(f".{verb}() calls {name}{_ARGS[verb]}, but {name}{sig} cannot be "
                        f"called so ({exc})") from None
    return fn


@dataclass(frozen=True)
class MapOp:
    fn: Callable[[Any], Any]

    def describe(self) -> str:
        return f"map({_name(self.fn)})"


@dataclass(frozen=True)
class RandomMapOp:
    fn: Callable[[Any, np.random.Generator], Any]
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", seed(self.seed, "random_map seed"))

    def describe(self) -> str:
        return f"random_map({_name(self.fn)})"


@dataclass(frozen=True)
class FilterOp:
    pred: Callable[[Any], bool]

    def describe(self) -> str:
        return f"filter({_name(self.pred)})"


@dataclass(frozen=True)
class FlatMapOp:
    fn: Callable[[Any], Iterable[Any]]

    def describe(self) -> str:
        return f"flat_map({_name(self.fn)})"


@dataclass(frozen=True)
class BatchOp:
    """`batch()`: `size` elements stacked, ragged leaves padded as `pad` says
    (`aioloader.elements.padding`; `rules` is what collate follows)."""

    size: int
    drop_remainder: bool = False
    pad: Any = None
    pad_value: Any = 0
    truncate: bool = False
    masks: bool = True
    rules: Rule = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", whole(self.size, "batch size", 1))
        object.__setattr__(self, "drop_remainder",
                           flag(self.drop_remainder, "batch drop_remainder"))
        object.__setattr__(self, "truncate", flag(self.truncate, "batch truncate"))
        object.__setattr__(self, "masks", flag(self.masks, "batch masks"))
        object.__setattr__(self, "rules", pad_rules(self.pad, self.pad_value, self.truncate))

    def describe(self, size: str | None = None) -> str:
        """One line; `size`: shown in place of the size (a global batch's, padded)."""
        return (f"batch({self.size if size is None else size}"
                f"{', drop_remainder' if self.drop_remainder else ''}"
                f"{describe_padding(self.pad, self.pad_value, self.truncate, self.masks)})")


@dataclass(frozen=True)
class PackOp:
    length_struct: Mapping[str, int]
    num_packing_bins: int

    def __post_init__(self) -> None:
        check_pack_config(self.length_struct, self.num_packing_bins)
        object.__setattr__(self, "length_struct", dict(self.length_struct))
        object.__setattr__(self, "num_packing_bins", int(self.num_packing_bins))

    def describe(self) -> str:
        return f"pack({dict(self.length_struct)}, bins={self.num_packing_bins})"


RecordOp = MapOp | RandomMapOp | FilterOp | FlatMapOp


def one_to_many(ops: Sequence[Any]) -> bool:
    """Whether a record may become other than one element (a filter or a flat_map): then an
    element's position depends on the elements before it (stream mode, no random access)."""
    return any(isinstance(op, (FilterOp, FlatMapOp)) for op in ops)


@dataclass
class OpTimes:
    """What each op of a pipeline received and the seconds it took, summed over the calls
    that timed it (a worker times one task's): op i is `record_ops[i]`, then the batch ops
    after them. `items` counts elements for a record op, batches for a batch op.

    Timed once per op per call (a `perf_counter` pair around the op's loop), never per
    record: the cost does not show.
    """

    items: list[int]
    seconds: list[float]

    @classmethod
    def zeros(cls, n: int) -> OpTimes:
        return cls([0] * n, [0.0] * n)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def record_rng(seed: int, epoch: int, index: int, op_position: int,
               expansion: int = 0) -> np.random.Generator:
    """The generator `random_map` op `op_position` gets for record `index` in `epoch`
    (`expansion`: which of the elements a flat_map made of the record, 0 without one).

    Philox is counter-based: the counter's low word advances as numbers are drawn, and the
    high words hold (index, epoch, op + expansion << 32), so every element has its own
    non-overlapping stream.
    """
    counter = [0, index, epoch, op_position + (expansion << 32)]
    return np.random.Generator(np.random.Philox(key=seed % 2**128, counter=counter))


def apply_record_ops(ops: Sequence[RecordOp], elements: list, indices: Sequence[int],
                     epochs: Sequence[int], paths: Sequence[str] | None = None, *,
                     times: OpTimes | None = None, survivors: list[int] | None = None
                     ) -> list:
    """Run the record ops over a batch of elements, op by op; filtered ones are dropped.

    `indices`/`epochs` key `random_map`'s generators; `paths` (each record's file) only go
    into error messages. One loop per op keeps the per-record cost to the user's function.
    With `times`, op i's elements and seconds are added to its entry i (the caller's
    record, not a global: this stays a pure function of its inputs). `survivors`, if given,
    receives the input positions of the elements that survive (a record a flat_map expanded
    once per element it became, in order).
    """
    keep = list(range(len(elements)))  # positions (in the input) of the surviving elements
    sub: list[int] | None = None  # each element's place among its record's (a flat_map's)
    clock = time.perf_counter
    for pos, op in enumerate(ops):
        k = 0
        t0 = clock()
        out: list = []
        append = out.append
        try:
            if isinstance(op, MapOp):
                fn = op.fn
                for k, x in enumerate(elements):  # noqa: B007 (k names the record on error)
                    append(fn(x))
            elif isinstance(op, RandomMapOp):
                rfn, seed = op.fn, op.seed  # (fn takes an rng too: not `fn`'s type)
                for k, x in enumerate(elements):
                    i = keep[k]
                    append(rfn(x, record_rng(seed, epochs[i], indices[i], pos,
                                             sub[k] if sub is not None else 0)))
            elif isinstance(op, FlatMapOp):
                fn = op.fn
                kept = []
                for k, x in enumerate(elements):
                    made = _expand(fn(x))
                    out += made
                    kept += [keep[k]] * len(made)
                keep, sub = kept, _renumber(kept)
            else:
                pred = op.pred
                passed = []
                for k, x in enumerate(elements):
                    if pred(x):
                        append(x)
                        passed.append(k)
                keep = [keep[k] for k in passed]
                if sub is not None:
                    sub = [sub[k] for k in passed]
        except Exception as exc:
            raise _failed(op, exc, keep[k], indices, epochs, paths) from None
        if times is not None:
            times.items[pos] += len(elements)
            times.seconds[pos] += clock() - t0
        elements = out
    if survivors is not None:
        survivors.extend(keep)
    return elements


def _failed(op: RecordOp, exc: Exception, i: int, indices: Sequence[int],
            epochs: Sequence[int], paths: Sequence[str] | None) -> TransformError:
    """The error for `op` raising `exc` on input `i`: the record, its epoch and file, and
    the user's traceback."""
    where = f" in {paths[i]}" if paths and paths[i] else ""
    return TransformError(
        f"{op.describe()} raised {type(exc).__name__}: {exc} on record {indices[i]} "
        f"(epoch {epochs[i]}){where}\n--- original traceback ---\n"
        + "".join(traceback.format_exception(exc)))


def _expand(made: Any) -> list:
    """What a flat_map returned, as a list; a string, bytes or a mapping is refused (it
    iterates as characters or keys, seldom what was meant)."""
    if isinstance(made, (str, bytes, bytearray, Mapping)):
        raise TypeError(f"flat_map must return an iterable of elements, got "
                        f"{type(made).__name__}; wrap one element in a list: [element]")
    try:
        return list(made)
    except TypeError:
        raise TypeError(f"flat_map must return an iterable of elements (a list, a "
                        f"generator), got {type(made).__name__}") from None


def _renumber(keep: list[int]) -> list[int]:
    """Each element's place among the elements its record became, in order (a record's
    elements are consecutive: they came from one input of this call)."""
    out, last, n = [], -1, 0
    for i in keep:
        n = n + 1 if i == last else 0
        last = i
        out.append(n)
    return out


def apply_batch_ops(ops: Sequence[MapOp], batch: Any, *, times: OpTimes | None = None,
                    first: int = 0) -> Any:
    """Run the batch ops (maps after batch) over one batch; with `times`, op i counts the
    batch and its seconds in entry `first + i` (`first`: the number of record ops)."""
    clock = time.perf_counter
    for pos, op in enumerate(ops, first):
        t0 = clock()
        try:
            batch = op.fn(batch)
        except Exception as exc:
            raise TransformError(
                f"{op.describe()} (after batch) raised {type(exc).__name__}: {exc}\n"
                "--- original traceback ---\n" + "".join(traceback.format_exception(exc))
            ) from None
        if times is not None:
            times.items[pos] += 1
            times.seconds[pos] += clock() - t0
    return batch
