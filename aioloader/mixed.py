"""`MixSpec`: the description of `Dataset.mix` / `Dataset.concatenate` (a dataset's source).

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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .arguments import maybe_seed
from .description import JaxProcessShard, SourceSpec
from .objects import ObjectSource, read_records
from .selection import MixedIndex, PositionIndex

if TYPE_CHECKING:
    from .dataset import Dataset
    from .sampling import IndexOp


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


def mix_inputs(datasets: Any, verb: str) -> tuple[Dataset, ...]:
    """`datasets` as a tuple; one Dataset is refused (iterating it would read it)."""
    from .dataset import Dataset

    if isinstance(datasets, Dataset):
        raise TypeError(f"{verb}() takes a list of datasets, got one Dataset: "
                        f"{verb}([ds1, ds2, ...])")
    return tuple(datasets)


def _why_not_an_input(ds: Dataset) -> str | None:
    from .sampling import Shuffle

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


@dataclass(frozen=True)
class MixSpec:
    """Inputs mixed by integer proportions `props` (Grain's), or laid end to end (`props`
    None: concatenate)."""

    inputs: tuple[Dataset, ...]
    props: tuple[int, ...] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        verb = "concatenate" if self.props is None else "mix"
        object.__setattr__(self, "seed", maybe_seed(self.seed, "mix seed"))
        from .dataset import Dataset

        if not self.inputs:
            raise ValueError(f"{verb}() needs at least one dataset")
        for i, ds in enumerate(self.inputs):
            if not isinstance(ds, Dataset):
                raise TypeError(f"{verb}() input {i} is a {type(ds).__name__}, not an "
                                "aioloader Dataset")
            why = _why_not_an_input(ds)
            if why is not None:
                raise ValueError(f"{verb}() input {i} ({' -> '.join(ds.describe())}) cannot "
                                 f"be mixed: {why}")
        leaves = list(self.leaves())
        objects = [isinstance(s, ObjectSource) for s in leaves]
        if any(objects) and not all(objects):
            raise ValueError(f"{verb}() cannot combine from_source() datasets with ArrayRecord "
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
        return SourceSpec(self.paths, dict(self.storage_options), self.verify)

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


def build_index(spec: MixSpec, part_records: Sequence[int]) -> MixedIndex:
    """The mix's index over the combined source, whose leaves' patterns (objects) hold
    `part_records` records each, in order."""
    from .indexplan import IndexPlan

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


def _ops(ds: Dataset) -> list[IndexOp]:
    """An input's index ops (never shard_by_jax_process(): `MixSpec` refused it)."""
    return list(ds.index_ops)  # type: ignore[arg-type]
