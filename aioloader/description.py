"""The parts of a `Dataset` that are not verbs: where its records come from (`SourceSpec`),
the placeholder `shard_by_jax_process()` leaves until the loader starts, and what a
description says of itself before anything runs (its stages, one a line; whether it can
travel to worker processes).

Apart from `dataset.py` so that the verbs' module stays the facade users read, and so that
`mixed` can name a source without importing the facade (which imports `mixed`).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .arguments import flag
from .arrayrecord.chunk import DEFAULT_VERIFY
from .arrayrecord.index import VERIFY_LEVELS
from .dataslices import table_of
from .errors import MissingExtraError
from .objects import ObjectSource
from .sampling import Repeat, Slice
from .transforms import dumps_op
from .urls import redact

if TYPE_CHECKING:
    from .dataset import Dataset


@dataclass(frozen=True)
class SourceSpec:
    """Where the records come from (picklable: workers and checkpoints can rebuild it)."""

    paths: tuple[str, ...]
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    verify: str = DEFAULT_VERIFY

    def __post_init__(self) -> None:
        """`paths` may be one path or any sequence of them; it is kept as a tuple of str."""
        paths: Any = self.paths
        if isinstance(paths, (str, os.PathLike)):
            paths = (paths,)
        if isinstance(paths, bytes) or not isinstance(paths, Sequence) or not paths or \
                not all(isinstance(p, (str, os.PathLike)) for p in paths):
            raise TypeError(f"from_arrayrecord() paths must be a path or URL, or a non-empty "
                            f"list of them (str or os.PathLike), got {redact(repr(paths))}")
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in paths))
        if not isinstance(self.storage_options, Mapping):
            raise TypeError(f"from_arrayrecord() storage_options must be a dict, got "
                            f"{type(self.storage_options).__name__}")
        object.__setattr__(self, "storage_options", dict(self.storage_options))
        if self.verify not in VERIFY_LEVELS:
            raise ValueError(f"from_arrayrecord() verify must be one of {VERIFY_LEVELS}, got "
                             f"{self.verify!r}")

    def __repr__(self) -> str:
        """Paths redacted, and the options' names only: their values hold credentials."""
        return (f"SourceSpec(paths={tuple(redact(p) for p in self.paths)!r}, "
                f"storage_options=<{', '.join(map(str, self.storage_options)) or 'none'}>, "
                f"verify={self.verify!r})")


@dataclass(frozen=True)
class JaxProcessShard:
    """`shard_by_jax_process()`: resolved to a `Shard` when the loader starts, by the data
    slice of each process (`layout`, from the sharding it was given; None: from the one
    given to `to_jax`, or on one process the whole batch; `aioloader.dataslices`)."""

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


def check_not_endless(ds: Dataset, verb: str) -> None:
    """Refuse `verb` (a repeat) on a dataset that never ends, as Grain does: it follows a
    `repeat()` with no count that no slice `[:n]` made finite, or is a mix of such inputs."""
    from .mixed import MixSpec  # (mixed imports this module)

    def endless(ds: Dataset) -> bool:
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


def stage_lines(ds: Dataset) -> list[str]:
    """`ds`'s pipeline, one stage per line (file names redacted)."""
    from .mixed import MixSpec  # (mixed imports this module)

    source = ds.source
    if isinstance(source, MixSpec):
        lines = [source.describe()]
    else:
        paths = source.paths
        more = f" +{len(paths) - 1} more" if len(paths) > 1 else ""
        lines = [f"source({redact(paths[0])}{more})"]
    lines += [op.describe() for op in ds.index_ops]
    lines += [op.describe() for op in ds.record_ops]
    if ds.batching is not None:
        lines.append(ds.batching.describe())
    if ds.pack_batch is not None:
        lines.append(ds.pack_batch.describe())
    lines += [op.describe() + " [per batch]" for op in ds.batch_ops]
    return lines


def check_picklable(ds: Dataset) -> None:
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
                "copy; use workers=0, or a source that pickles") from None
    for op in (*ds.record_ops, *ds.batch_ops):
        try:
            dumps_op(op)
        except Exception as exc:
            raise TypeError(
                f"{op.describe()} cannot be pickled for worker processes "
                f"({type(exc).__name__}: {exc}): it holds something that cannot travel to "
                "another process; create that inside the function, or use workers=0"
            ) from None
