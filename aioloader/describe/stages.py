"""`Stages`: what a `Dataset` holds — source → index ops → record ops → batching — and the
verbs that each return a copy with one more stage.

The base of `Dataset` (`dataset`), which adds the constructors and the methods that start the
runtime: everything here is pure, so the verbs read apart from what runs them. The
stages run in different places: index ops (shuffle, repeat, shard, slicing) are pure functions
of a position (`sampling`); record ops (map, random_map, filter, flat_map) and the batching
step (batch or pack, plus maps after it) run where records are decoded (`workers`). Names
follow Grain where they mean the same thing.

Record ops commute with index ops (they act on one record at a time), so they may be called
in any order relative to shuffle/repeat/shard; index ops after `batch` or `pack` are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..arguments import maybe_whole
from ..elements.bucketing import BucketOp
from ..elements.transforms import (
    BatchOp,
    FilterOp,
    FlatMapOp,
    MapOp,
    PackOp,
    RandomMapOp,
    RecordOp,
    transform_fn,
)
from ..index.sampling import IndexOp, Repeat, Shard, Shuffle
from .description import (
    JaxProcessShard,
    MixSpec,
    SourceSpec,
    check_not_endless,
    check_picklable,
    jax_process_shard,
    stage_lines,
)
from .objects import ObjectSource

_S = TypeVar("_S", bound="Stages")


@dataclass(frozen=True)
class Stages:
    """The stages of a pipeline and the verbs that add them (see `Dataset`)."""

    source: SourceSpec | ObjectSource | MixSpec
    index_ops: tuple[IndexOp | JaxProcessShard, ...] = ()
    record_ops: tuple[RecordOp, ...] = ()
    batching: BatchOp | PackOp | BucketOp | None = None
    pack_batch: BatchOp | None = None  # batch() after pack()
    batch_ops: tuple[MapOp, ...] = ()  # map() after batch()

    def __repr__(self) -> str:
        options = ", ".join(map(str, self.source.storage_options))
        return (f"Dataset({' -> '.join(self.describe())}"
                + (f"; storage_options=<{options}>" if options else "") + ")")

    def describe(self) -> list[str]:
        """The pipeline, one stage per line."""
        return stage_lines(self)

    def check_picklable(self) -> None:
        """Raise a clear error, before any worker starts, when a transform cannot travel to
        worker processes (it holds a lock, an open file or socket...), or the source of a
        `from_source()` dataset cannot (workers read records from their own copy)."""
        check_picklable(self)

    # -- index ops --------------------------------------------------------------------

    def _index(self: _S, op: IndexOp | JaxProcessShard) -> _S:
        if self.batching is not None:
            raise ValueError(f"{type(op).__name__.lower()}() must come before "
                             f"{self._batching_verb()}: it reorders records, not batches")
        return replace(self, index_ops=(*self.index_ops, op))

    def shuffle(self: _S, seed: int, *, strategy: str = "exact", block_bytes: int | None = None,
                window_bytes: int | None = None, window: None = None) -> _S:
        """Exact global shuffle (a keyed permutation, re-keyed every epoch).

        `strategy="block"` trades randomness for I/O: the files are cut into blocks of whole
        chunks of about `block_bytes`, the blocks are put in a random order every epoch, and
        records are shuffled within windows of about `window_bytes` of decoded records
        (consecutive blocks, at least one). Unset, they are sized from the loader's budgets:
        4 MiB and 64 MiB, less where half of `resident_bytes` or of `memory_budget` is
        smaller (the window at most that, of at least 4 blocks); `stats()` shows them, and
        a resumed state keeps its own. So reads are whole
        blocks and memory is bounded by the window, for files of any group size. With
        `shard_by_jax_process()`, each process reads only its ~1/P share of every window
        (README, "Shuffling"); resume, elastic included, stays exact.
        """
        if window is not None:
            raise TypeError("shuffle(window=...) counted chunks and is gone: the block "
                            "shuffle's window is now window_bytes= (and its blocks "
                            "block_bytes=), e.g. shuffle(seed, strategy='block', "
                            "window_bytes=64 << 20)")
        if strategy == "block" and isinstance(self.source, MixSpec):
            raise ValueError("a block shuffle cuts one source's files into blocks, and a "
                             "mix has several: use shuffle(seed) (exact) after mixing")
        if strategy == "block" and isinstance(self.source, ObjectSource):
            raise ValueError("a block shuffle reads runs of ArrayRecord chunks, and a "
                             "from_source() dataset has none: use shuffle(seed) (exact)")
        block = maybe_whole(block_bytes, "block_bytes", 1, floats=True)  # None: the default
        window_b = maybe_whole(window_bytes, "window_bytes", 1, floats=True)
        return self._index(Shuffle(seed, strategy, block or 0, window_b or 0))

    def block_shuffle(self: _S, seed: int, *, block_bytes: int | None = None,
                      window_bytes: int | None = None) -> _S:
        """Shorthand for `shuffle(seed, strategy="block", block_bytes=..., window_bytes=...)`."""
        return self.shuffle(seed, strategy="block", block_bytes=block_bytes,
                            window_bytes=window_bytes)

    def repeat(self: _S, num_epochs: int | None = None) -> _S:
        """Repeat the records `num_epochs` times (None: forever); shuffles re-key per epoch.
        An empty dataset repeated is empty; an endless one cannot be repeated (as Grain)."""
        op = Repeat(num_epochs)
        check_not_endless(self, "repeat()")
        return self._index(op)

    def shard(self: _S, index: int, count: int, *, contiguous: bool = False,
              drop_remainder: bool = False) -> _S:
        """Keep shard `index` of `count` (strided by default)."""
        return self._index(Shard(index, count, contiguous, drop_remainder))

    def shard_by_jax_process(self: _S, *, drop_remainder: bool = True,
                             sharding: Any = None) -> _S:
        """This process's shard of every global batch: processes whose devices hold the same
        rows of the batch's `sharding` (replicas over a 'model' axis) load the same rows, the
        others different ones; `.batch(n)`'s n is the global batch ÷ the number of such data
        slices (`aioloader.jax.data_slice`). The sharding is the one given to `to_jax`, or
        here; on several processes, a loader with neither refuses to start."""
        return self._index(jax_process_shard(drop_remainder, sharding))

    def _batching_verb(self) -> str:
        """The step that batches, as its errors name it."""
        return "bucket_by_length()" if isinstance(self.batching, BucketOp) else "batch()/pack()"

    # -- record ops -------------------------------------------------------------------

    def _record(self: _S, op: RecordOp) -> _S:
        if self.batching is not None:
            if isinstance(op, MapOp):
                return replace(self, batch_ops=(*self.batch_ops, op))
            raise ValueError(f"{type(op).__name__} after {self._batching_verb()} is not "
                             "supported; apply it before batching")
        return replace(self, record_ops=(*self.record_ops, op))

    def map(self: _S, fn: Callable[[Any], Any]) -> _S:
        """Apply `fn` to every record (or, after batch(), to every batch). `fn`: a function,
        or an object with a `map` method (`aioloader.elements.transforms.Map`, Grain's `Map`)."""
        return self._record(MapOp(transform_fn(fn, "map", "map")))

    def random_map(self: _S, fn: Callable[[Any, Any], Any], *, seed: int | None = None) -> _S:
        """Apply `fn(element, rng)`; rng is a `np.random.Generator` keyed on the record. `fn`:
        a function, or an object with a `random_map` method (`RandomMap`, Grain's)."""
        fn = transform_fn(fn, "random_map", "random_map")
        if seed is None:
            seed = next((op.seed for op in self.index_ops if isinstance(op, Shuffle)), 0)
        return self._record(RandomMapOp(fn, seed))

    def filter(self: _S, predicate: Callable[[Any], bool]) -> _S:
        """Keep records for which `predicate` is true. `predicate`: a function, or an object
        with a `filter` method (`aioloader.elements.transforms.Filter`, Grain's `Filter`)."""
        return self._record(FilterOp(transform_fn(predicate, "filter", "filter")))

    def flat_map(self: _S, fn: Callable[[Any], Any]) -> _S:
        """Replace every record by the elements `fn(record)` returns (an iterable: zero or
        more), in order. `fn`: a function, or an object with a `flat_map` method
        (`aioloader.elements.transforms.FlatMap`, Grain's). Resume is exact mid-expansion; a
        record's elements are all made in one window's task, so keep the fan-out to what
        fits in memory (`window=` sets the records a window holds)."""
        return self._record(FlatMapOp(transform_fn(fn, "flat_map", "flat_map")))

    # -- batching ---------------------------------------------------------------------

    def batch(self: _S, batch_size: int, *, drop_remainder: bool = False, pad: Any = None,
              pad_value: Any = 0, truncate: bool = False, masks: bool = True) -> _S:
        """Stack `batch_size` elements into one batch (dicts/tuples/arrays → stacked arrays).

        `pad` pads ragged leaves along their first axis as they are stacked, where the batch
        is made (in the worker; after a filter, in the loader's process): `True` to the
        longest in the batch, an int to that length, or per field, `{"tokens": 128,
        "labels": True}` (a tuple for tuple elements; fields not named are stacked as
        before). Padding holds `pad_value` (one number, or per field in pad's shape;
        default 0). A longer element than a fixed length is an error naming the field and
        the record, unless `truncate=True` cuts it. Every padded field of a dict gets
        `name + "_mask"` (bool, True on data) beside it; `masks=False` leaves them out.
        Scalars and strings batch as before. (tf.data's `padded_batch`, first axis only,
        plus masks: `aioloader.elements.padding` says why.)
        """
        op = BatchOp(batch_size, drop_remainder, pad, pad_value, truncate, masks)
        if isinstance(self.batching, BucketOp):
            raise ValueError("bucket_by_length() makes the batches: batch() cannot follow it")
        if isinstance(self.batching, PackOp) and self.pack_batch is None:
            if op.rules is not None:
                raise ValueError("batch(pad=) after pack(): packed rows all have the length "
                                 "pack() gave them already; drop pad=")
            return replace(self, pack_batch=op)
        if self.batching is not None:
            raise ValueError("batch() was already applied")
        return replace(self, batching=op)

    def bucket_by_length(self: _S, length_fn: Callable[[Any], int], boundaries: Sequence[int],
                         batch_sizes: Sequence[int], *, pad: Any = True, pad_value: Any = 0,
                         truncate: bool = False, masks: bool = True,
                         drop_remainder: bool = False) -> _S:
        """Batches of elements of similar length (tf.data's `bucket_by_sequence_length`).

        An element goes to bucket b, the number of `boundaries` (strictly increasing) at or
        below `length_fn(element)`: below `boundaries[0]` to bucket 0, at or above the last
        to the last. Bucket b yields a batch of `batch_sizes[b]` (one size per bucket:
        `len(boundaries) + 1`) as soon as it holds that many, padded as `batch(pad=...)`
        pads (`pad`, `pad_value`, `truncate`, `masks`; by default to the longest in the
        batch, with `name + "_mask"`). At the end of the data the partial buckets follow in
        bucket order, or are dropped with `drop_remainder`.

        The batches do not depend on the worker count. `get_state()` stays a few integers:
        where the oldest element still waiting in a bucket is, and per bucket how many from
        there on were delivered; resuming re-reads the stream from that element (so from
        far back when a bucket rarely fills) and gives the same batches, bit for bit. A
        state resumes on the process count it was saved on. `length_fn` runs where the
        buckets are kept, in the loader's process.
        """
        if self.batching is not None:
            raise ValueError("bucket_by_length() batches: it cannot follow batch() or pack()")
        op = BucketOp(length_fn, boundaries, batch_sizes,  # type: ignore[arg-type]  # (checked)
                      pad, pad_value, truncate, masks, drop_remainder)
        return replace(self, batching=op)

    def pack(self: _S, length_struct: Mapping[str, int], *, num_packing_bins: int) -> _S:
        """First-fit packing into rows of fixed lengths, with `*_segment_ids`/`*_positions`.

        Yields packed rows; follow with `.batch(n)` to stack them.
        """
        if isinstance(self.batching, BucketOp):
            raise ValueError("pack() cannot follow bucket_by_length(): both make the batches, "
                             "use one of them")
        if self.batching is not None:
            raise ValueError("pack() must come before batch()")
        return replace(self, batching=PackOp(length_struct, num_packing_bins))
