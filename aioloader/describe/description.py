"""The parts of a `Dataset` that are not verbs: where its records come from (`SourceSpec`,
or `MixSpec` for a mix or concatenation of datasets), the placeholder
`shard_by_jax_process()` leaves until the loader starts, and what a description says of
itself before anything runs (its stages, one a line; whether it can travel to worker
processes).

Apart from `dataset.py` so that the verbs' module stays the facade users read. This module
never names `Dataset` (which imports it): what it reads of one is `Described`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from .. import formats as fmts
from ..arguments import flag, maybe_seed
from ..arrayrecord.levels import DEFAULT_VERIFY, VERIFY_LEVELS
from ..elements.transforms import dumps_op
from ..errors import MissingExtraError
from ..index.dataslices import table_of
from ..index.sampling import Repeat, Slice
from ..urls import redact
from .objects import ObjectSource, read_records


class Described(Protocol):
    """What the spec types and checks here read of a `Dataset` (`aioloader.describe.dataset`)."""

    @property
    def source(self) -> SourceSpec | ObjectSource | MixSpec: ...
    @property
    def index_ops(self) -> tuple[Any, ...]: ...
    @property
    def record_ops(self) -> tuple[Any, ...]: ...
    @property
    def batching(self) -> Any: ...
    @property
    def pack_batch(self) -> Any: ...
    @property
    def batch_ops(self) -> tuple[Any, ...]: ...
    def describe(self) -> list[str]: ...


@dataclass(frozen=True)
class SourceSpec:
    """Where the records come from (picklable: workers and checkpoints can rebuild it)."""

    paths: tuple[str, ...]
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    verify: str = DEFAULT_VERIFY
    # the record format of every path (`aioloader.formats`), or of each (a mix of formats)
    format: str | tuple[str, ...] = fmts.ARRAYRECORD

    def __post_init__(self) -> None:
        """`paths` may be one path or any ordered iterable of them (a list, `Path.glob`, a
        numpy array of names); it is kept as a tuple of str. A set is refused: its order,
        so the records' numbering, would differ between processes."""
        paths: Any = self.paths
        verb = f"from_{fmts.base(self.format)}()" if isinstance(self.format, str) \
            else "the source's"
        if isinstance(paths, (str, os.PathLike)):
            paths = (paths,)
        if isinstance(paths, (set, frozenset, Mapping)):
            raise TypeError(f"{verb} paths must be in an order the same in every "
                            "process (a list, or sorted(...)), not a "
                            f"{type(paths).__name__}")
        if isinstance(paths, Iterable) and not isinstance(paths, (bytes, Sequence)):
            paths = tuple(paths)
        if isinstance(paths, bytes) or not isinstance(paths, Sequence) or not paths or \
                not all(isinstance(p, (str, os.PathLike)) for p in paths):
            raise TypeError(f"{verb} paths must be a path or URL, or a non-empty "
                            f"list of them (str or os.PathLike), got {redact(repr(paths))}")
        object.__setattr__(self, "paths", tuple(str(os.fspath(p)) for p in paths))
        if not isinstance(self.storage_options, Mapping):
            raise TypeError(f"{verb} storage_options must be a dict, got "
                            f"{type(self.storage_options).__name__}")
        object.__setattr__(self, "storage_options", dict(self.storage_options))
        if self.verify not in VERIFY_LEVELS:
            raise ValueError(f"{verb} verify must be one of {VERIFY_LEVELS}, got "
                             f"{self.verify!r}")
        kinds = self.format
        if not isinstance(kinds, str):
            kinds = tuple(kinds)
            if len(kinds) != len(self.paths):
                raise ValueError("a source's formats name one format per path")
            if len(set(kinds)) == 1:
                kinds = kinds[0]
            object.__setattr__(self, "format", kinds)
        for kind in self.formats:
            fmts.check(kind)

    @property
    def formats(self) -> tuple[str, ...]:
        """The record format of each path, in order."""
        kinds = self.format
        return (kinds,) * len(self.paths) if isinstance(kinds, str) else kinds

    def __repr__(self) -> str:
        """Paths redacted, and the options' names only: their values hold credentials."""
        kind = "" if self.format == fmts.ARRAYRECORD else f", format={self.format!r}"
        return (f"SourceSpec(paths={tuple(redact(p) for p in self.paths)!r}, "
                f"storage_options=<{', '.join(map(str, self.storage_options)) or 'none'}>, "
                f"verify={self.verify!r}{kind})")


@dataclass(frozen=True)
class JaxProcessShard:
    """`shard_by_jax_process()`: resolved to a `Shard` when the loader starts, by the data
    slice of each process (`layout`, from the sharding it was given; None: from the one
    given to `to_jax`, or on one process the whole batch; `aioloader.index.dataslices`)."""

    drop_remainder: bool = True
    layout: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "drop_remainder", flag(
            self.drop_remainder, "shard_by_jax_process drop_remainder"))

    def describe(self) -> str:
        return "shard_by_jax_process()"


def jax_process_shard(drop_remainder: bool, sharding: Any) -> JaxProcessShard:
    """`shard_by_jax_process()`'s op; it needs jax, so without it fails here, not at load."""
    if importlib.util.find_spec("jax") is None:
        raise MissingExtraError("jax", "shard_by_jax_process()", "jax")
    layout = None if sharding is None else table_of(sharding)
    return JaxProcessShard(drop_remainder, layout)


class Concatenated:
    """Several random-access objects read as one (the source of a mix of `from_source()`
    datasets): picklable when they are."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = tuple(parts)
        self.part_lengths = tuple(len(p) for p in self.parts)
        self._starts = [0]
        for n in self.part_lengths:
            self._starts.append(self._starts[-1] + n)

    def __len__(self) -> int:
        return self._starts[-1]

    def _where(self, i: int) -> tuple[int, int]:
        import bisect

        if not 0 <= i < len(self):
            raise IndexError(f"record {i} out of range: the sources have {len(self)} records")
        k = bisect.bisect_right(self._starts, i) - 1
        return k, i - self._starts[k]

    def __getitem__(self, i: int) -> Any:
        k, j = self._where(int(i))
        return self.parts[k][j]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        by_part: dict[int, list[tuple[int, int]]] = {}
        for n, i in enumerate(indices):
            k, j = self._where(int(i))
            by_part.setdefault(k, []).append((n, j))
        out: list[Any] = [None] * len(indices)
        for k, pairs in by_part.items():
            got = read_records(self.parts[k], [j for _, j in pairs])
            for (n, _), x in zip(pairs, got, strict=True):
                out[n] = x
        return out


@dataclass(frozen=True)
class MixSpec:
    """Inputs mixed by integer proportions `props` (Grain's), or laid end to end (`props`
    None: concatenate); `Dataset.mix` checks each input is index-level (`aioloader.describe.mixed`
    says why)."""

    inputs: tuple[Described, ...]
    props: tuple[int, ...] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        verb = "concatenate" if self.props is None else "mix"
        object.__setattr__(self, "seed", maybe_seed(self.seed, "mix seed"))
        if not self.inputs:
            raise ValueError(f"{verb}() needs at least one dataset")
        leaves = list(self.leaves())
        objects = [isinstance(s, ObjectSource) for s in leaves]
        if any(objects) and not all(objects):
            raise ValueError(f"{verb}() cannot combine from_source() datasets with record "
                             "files: write the objects' records to ArrayRecord files, or mix "
                             "only from_source() datasets")
        if not any(objects):
            kinds = {(tuple(sorted(s.storage_options.items(), key=lambda kv: kv[0])),
                      s.verify) for s in leaves}
            if len(kinds) > 1:
                raise ValueError(f"{verb}() inputs read with different storage_options or "
                                 "verify: the mix reads all of them through one storage; "
                                 "give every input the same ones")

    def leaves(self) -> Iterator[SourceSpec | ObjectSource]:
        """The sources under the mix, in order (nested mixes flattened)."""
        for ds in self.inputs:
            if isinstance(ds.source, MixSpec):
                yield from ds.source.leaves()
            else:
                yield ds.source

    # What code that reads a source description finds (SourceSpec's fields).
    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for s in self.leaves() for p in s.paths)

    @property
    def storage_options(self) -> Mapping[str, Any]:
        return next(self.leaves()).storage_options

    @property
    def verify(self) -> str:
        return next(self.leaves()).verify

    @cached_property
    def combined(self) -> SourceSpec | ObjectSource:
        """The one source the loader opens: every input's files (objects) end to end."""
        leaves = list(self.leaves())
        if isinstance(leaves[0], ObjectSource):
            return ObjectSource(Concatenated([s.obj for s in leaves]))  # type: ignore[union-attr]
        return SourceSpec(self.paths, dict(self.storage_options), self.verify,
                          tuple(k for s in leaves for k in s.formats))  # type: ignore[union-attr]

    def describe(self) -> str:
        """One line (the pipeline's first step in fingerprints and graphs)."""
        inner = " | ".join(" -> ".join(ds.describe()) for ds in self.inputs)
        if self.props is None:
            return f"concatenate({inner})"
        seed = "" if self.seed is None else f", seed={self.seed}"
        return f"mix({inner}; proportions={list(self.props)}{seed})"


def opened(source: Any) -> Any:
    """The source a loader opens for a dataset's `source` (a mix's `combined` one)."""
    return source.combined if isinstance(source, MixSpec) else source


def check_not_endless(ds: Described, verb: str) -> None:
    """Refuse `verb` (a repeat) on a dataset that never ends, as Grain does: it follows a
    `repeat()` with no count that no slice `[:n]` made finite, or is a mix of such inputs."""
    def endless(ds: Described) -> bool:
        source = ds.source
        out = isinstance(source, MixSpec) and source.props is not None and \
            all(endless(d) for d in source.inputs)
        for op in ds.index_ops:
            if isinstance(op, Repeat):
                out = out or op.num_epochs is None
            elif isinstance(op, Slice) and op.stop is not None:
                out = False
        return out

    if endless(ds):
        raise ValueError(f"{verb} of an endless dataset (after a repeat() with no "
                         "num_epochs) would change nothing: drop one of the repeats, or "
                         "make the first finite (repeat(n), or a slice [:n] after it)")


def stage_lines(ds: Described) -> list[str]:
    """`ds`'s pipeline, one stage per line (file names redacted)."""
    source = ds.source
    if isinstance(source, MixSpec):
        lines = [source.describe()]
    else:
        paths = source.paths
        more = f" +{len(paths) - 1} more" if len(paths) > 1 else ""
        lines = [f"{source_verb(source)}({redact(paths[0])}{more}{columns_shown(source)})"]
    lines += [op.describe() for op in ds.index_ops]
    lines += [op.describe() for op in ds.record_ops]
    if ds.batching is not None:
        lines.append(ds.batching.describe())
    if ds.pack_batch is not None:
        lines.append(ds.pack_batch.describe())
    lines += [op.describe() + " [per batch]" for op in ds.batch_ops]
    return lines


def source_verb(source: Any) -> str:
    """What a source's stage is called: "source" for ArrayRecord files (and objects), the
    format's name for others ("tfrecord"), the formats' for several ("tfrecord+arrayrecord")."""
    kinds = [fmts.base(k) for k in getattr(source, "formats", (fmts.ARRAYRECORD,))]
    if all(k == fmts.ARRAYRECORD for k in kinds):
        return "source"
    return "+".join(dict.fromkeys(kinds))


def columns_shown(source: Any) -> str:
    """", columns=[...]" when a source's files are read with one selection of columns
    (`fmts.reading`), else ""."""
    kinds = getattr(source, "formats", ())
    selections = {fmts.split(k)[1] for k in kinds}
    if len(selections) != 1 or None in selections:
        return ""
    return f", columns={list(selections.pop() or ())!r}"


def check_picklable(ds: Described) -> None:
    """Raise a clear error when `ds`'s transforms, or its `from_source()` object, cannot be
    pickled for worker processes (see `Dataset.check_picklable`)."""
    source = getattr(ds.source, "combined", ds.source)  # a mix: its inputs end to end
    if isinstance(source, ObjectSource):
        try:
            dumps_op(source.obj)
        except Exception as exc:
            raise TypeError(
                f"the source {source.name} cannot be pickled for worker processes "
                f"({type(exc).__name__}: {exc}): each worker reads records from its own "
                "copy; use workers=0 or executor=\"threads\" (threads of this process read "
                "the source itself), or a source that pickles") from None
    for op in (*ds.record_ops, *ds.batch_ops):
        try:
            dumps_op(op)
        except Exception as exc:
            raise TypeError(
                f"{op.describe()} cannot be pickled for worker processes "
                f"({type(exc).__name__}: {exc}): it holds something that cannot travel to "
                "another process; create that inside the function, or use workers=0 or "
                "executor=\"threads\" (threads of this process run it as it is)"
            ) from None
