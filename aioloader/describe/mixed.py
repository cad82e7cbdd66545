"""A mix's index: `build_index` maps each output position of `Dataset.mix` /
`Dataset.concatenate` to one record of the inputs' sources laid end to end. The mix's
description, `MixSpec`, is a spec type of `aioloader.describe.description` (re-exported here).

Scope, and why. A mix is index arithmetic (`selection`): each output position names an input
and a position in it, and the input's own index ops (shuffle, repeat, shard, slice) name a
record. So the inputs must be *index-level* pipelines: a source and index ops, nothing that
runs on records (map, random_map, filter, batch, pack go after the mix, where they apply to
every element alike) and no `shard_by_jax_process()` (shard the mix, so that elastic resume
keeps working) or block shuffle (it cuts one source's files into blocks). Inputs outside
this scope are refused when the pipeline is described, naming the input and why.

Under that scope the runtime needs nothing new: the inputs' files (or objects) are laid end
to end as one source (`combined`), input i's records offset by the records before it, and
the compiled plan (`build_index`) maps every output position to one record of that source.
The position of each input is a function of the loader state's one output position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from ..index.indexplan import IndexPlan
from ..index.sampling import IndexOp, Shuffle
from ..index.selection import MixedIndex, PositionIndex
from .description import Concatenated, Described, JaxProcessShard, MixSpec, opened

D = TypeVar("D", bound=Described)

__all__ = ["Concatenated", "MixSpec", "build_index", "mix_inputs", "opened", "why_not_an_input"]


def mix_inputs(datasets: Any, verb: str, dataset: type[D]) -> tuple[D, ...]:
    """`datasets` as a tuple, each an index-level instance of `dataset` (`Dataset`, which
    `Dataset.mix` passes: this module does not import it); one Dataset is refused
    (iterating it would read it)."""
    if isinstance(datasets, dataset):
        raise TypeError(f"{verb}() takes a list of datasets, got one Dataset: "
                        f"{verb}([ds1, ds2, ...])")
    datasets = tuple(datasets)
    for i, ds in enumerate(datasets):
        if not isinstance(ds, dataset):
            raise TypeError(f"{verb}() input {i} is a {type(ds).__name__}, not an "
                            "aioloader Dataset")
        why = why_not_an_input(ds)
        if why is not None:
            raise ValueError(f"{verb}() input {i} ({' -> '.join(ds.describe())}) cannot "
                             f"be mixed: {why}")
    return datasets


def why_not_an_input(ds: Described) -> str | None:
    """Why `ds` cannot be an input of a mix (None: it can)."""
    if ds.record_ops:
        return (f"it has {ds.record_ops[0].describe()}: the inputs of a mix are index-level "
                "(source, shuffle, repeat, shard, slice); apply record transforms after "
                "mixing, to every element")
    if ds.batching is not None:
        return "it is batched or packed: batch or pack after mixing"
    for op in ds.index_ops:
        if isinstance(op, JaxProcessShard):
            return ("it has shard_by_jax_process(): shard the mix instead (each process then "
                    "reads its share of the mixed stream, and elastic resume keeps working)")
        if isinstance(op, Shuffle) and op.strategy == "block":
            return ("it has a block shuffle, which cuts one source's files into blocks: use "
                    "shuffle(seed) (exact) in a mix's inputs")
    return None


def build_index(spec: MixSpec, part_records: Sequence[int]) -> MixedIndex:
    """The mix's index over the combined source, whose leaves' patterns (objects) hold
    `part_records` records each, in order."""
    if len(part_records) != len(spec.paths):  # one count per pattern (object), in order
        raise ValueError(f"a mix of {len(spec.paths)} sources was opened as "
                         f"{len(part_records)} parts: cannot tell its inputs' records apart")
    parts = iter(part_records)
    offset = 0

    def build(s: MixSpec) -> MixedIndex:
        nonlocal offset
        inputs: list[PositionIndex] = []
        offsets: list[int] = []
        for ds in s.inputs:
            if isinstance(ds.source, MixSpec):
                inputs.append(IndexPlan(0, _ops(ds), base=build(ds.source)))
                offsets.append(0)  # the nested mix's records are already offset
                continue
            n = sum(next(parts) for _ in ds.source.paths)
            try:
                inputs.append(IndexPlan(n, _ops(ds)))
            except ValueError as e:
                raise ValueError(f"{' -> '.join(ds.describe())}: {e}") from None
            offsets.append(offset)
            offset += n
        return MixedIndex(tuple(inputs), tuple(offsets), s.props, s.seed)

    return build(spec)


def _ops(ds: Described) -> list[IndexOp]:
    """An input's index ops (never shard_by_jax_process(): `MixSpec` refused it)."""
    return list(ds.index_ops)  # type: ignore[arg-type]
