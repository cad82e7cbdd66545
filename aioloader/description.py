"""The parts of a `Dataset` that are not verbs: where its records come from (`SourceSpec`),
the placeholder `shard_by_jax_process()` leaves until the loader starts, and what a
description says of itself before anything runs (its stages, one a line; whether it can
travel to worker processes).

Apart from `dataset.py` so that the verbs' module stays the facade users read, and so that
`mixed` can name a source without importing the facade (which imports `mixed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .arrayrecord.chunk import DEFAULT_VERIFY
from .objects import ObjectSource
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

    def __repr__(self) -> str:
        """Paths redacted, and the options' names only: their values hold credentials."""
        return (f"SourceSpec(paths={tuple(redact(p) for p in self.paths)!r}, "
                f"storage_options=<{', '.join(map(str, self.storage_options)) or 'none'}>, "
                f"verify={self.verify!r})")


@dataclass(frozen=True)
class JaxProcessShard:
    """`shard_by_jax_process()`: resolved to a `Shard` when the loader starts."""

    drop_remainder: bool = True

    def describe(self) -> str:
        return "shard_by_jax_process()"


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
