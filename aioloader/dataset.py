"""`Dataset`: the declarative, immutable, picklable description of a pipeline.

Each verb returns a new `Dataset`; nothing runs until `.loader()`. The description splits in
three parts that run in different places: index ops (shuffle, repeat, shard, slicing) are pure
functions of a position (`sampling`); record ops (map, random_map, filter, flat_map) and the
batching step (batch or pack, plus maps after it) run in worker processes (`workers`); the
loader schedules it all (`loader`). Names follow Grain where they mean the same thing.

Record ops commute with index ops (they act on one record at a time), so they may be called
in any order relative to shuffle/repeat/shard; index ops after `batch` or `pack` are refused.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

import numpy as np

from .arguments import maybe_whole
from .arrayrecord.levels import DEFAULT_VERIFY
from .description import (
    JaxProcessShard,
    MixSpec,
    SourceSpec,
    check_not_endless,
    check_picklable,
    jax_process_shard,
    stage_lines,
)
from .mixed import mix_inputs
from .objects import ObjectSource, check_source
from .options import (
    GcsClient,
    LoaderOptions,
    ReadOptions,
    RetryPolicy,
    WorkerOptions,
    unknown_options_error,
)
from .sampling import IndexOp, Repeat, Shard, Shuffle, Slice
from .selection import proportions
from .transforms import (
    BatchOp,
    FilterOp,
    FlatMapOp,
    MapOp,
    PackOp,
    RandomMapOp,
    RecordOp,
    transform_fn,
)
from .urls import has_glob, is_gcs

if TYPE_CHECKING:
    from .runtime.loader import Loader


@dataclass(frozen=True)
class Dataset:
    """An immutable, picklable description of a pipeline: source → index ops → record ops →
    batching.

    Build one with `from_arrayrecord`, `from_source`, `mix` or `concatenate`, chain verbs
    (`shuffle`, `repeat`, `shard`, `shard_by_jax_process`, slicing, `map`, `random_map`,
    `flat_map`, `filter`, `pack`, `batch`), each returning a new `Dataset`, and run it with
    `loader()`. Nothing is read until then, so a description can be built anywhere (before
    `jax.distributed` starts) and sent to other processes. Pipelines of one-to-one steps are
    also random access: `len(ds)`, `ds[i]`, `ds[[i, j]]` give the elements the loader yields
    at those positions.
    """

    source: SourceSpec | ObjectSource | MixSpec
    index_ops: tuple[IndexOp | JaxProcessShard, ...] = ()
    record_ops: tuple[RecordOp, ...] = ()
    batching: BatchOp | PackOp | None = None
    pack_batch: BatchOp | None = None  # batch() after pack()
    batch_ops: tuple[MapOp, ...] = ()  # map() after batch()

    def __repr__(self) -> str:
        options = ", ".join(map(str, self.source.storage_options))
        return (f"Dataset({' -> '.join(self.describe())}"
                + (f"; storage_options=<{options}>" if options else "") + ")")

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_arrayrecord(
        cls,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        storage_options: Mapping[str, Any] | None = None,
        verify: str = DEFAULT_VERIFY,
        decode: Any = None,
    ) -> Dataset:
        """Records of ArrayRecord files: a path, URL, glob, or a list of them; a name
        ending in `[start:end]` reads records start..end-1 of that file (as
        `ArrayRecordSource` says).

        `decode="auto"` turns each record into the arrays (a dict of them for named fields)
        that the files' recorded element spec describes (`aioloader.typed`; written by
        `convert --from npy`, `--decode-examples`, or `ArrayRecordWriter(element_spec=)`):
        it opens the files' footers now to read it. `decode=spec` (an `ElementSpec` or its
        JSON) uses that spec without opening anything. `verify` is `ArrayRecordSource`'s:
        "all" (every stored hash, chunk data included), "headers" or "none".
        """
        source = SourceSpec(paths, storage_options or {}, verify)  # type: ignore[arg-type]
        if any(is_gcs(p) and has_glob(p) for p in source.paths):
            from .preimport import import_started

            import_started("gcsfs")  # its listing needs gcsfs: import it while the rest starts
        if decode is None:
            return cls(source)
        from .source import recorded_spec  # opening files only when asked to
        from .typed import Decode, ElementSpec

        if isinstance(decode, ElementSpec):
            spec = decode
        elif decode == "auto":
            spec = recorded_spec(source.paths, source.storage_options, source.verify)
        elif isinstance(decode, (str, bytes)):
            spec = ElementSpec.from_json(decode)
        else:
            raise TypeError(f"decode= takes 'auto', an ElementSpec or its JSON, not "
                            f"{type(decode).__name__}")
        return cls(source, record_ops=(MapOp(Decode(spec)),))

    @classmethod
    def from_source(cls, source: Any) -> Dataset:
        """Records of any object with `__len__` and `__getitem__`: a Grain data source, a
        list of records, ours.

        An `ArrayRecordSource` reads as `from_arrayrecord` would (its files, through the
        loader's own reads). Any other object is read by index where records are decoded
        (`aioloader.objects`): each worker process gets a pickled copy of it (so it must
        pickle, and a list's records travel with it), `workers=0` reads it in place.
        """
        from .source import ArrayRecordSource  # describing a pipeline imports no I/O

        if isinstance(source, ArrayRecordSource):
            config = source._config  # what a copy of it reopens: its paths and options
            return cls.from_arrayrecord(config["paths"], verify=config["verify"],
                                        storage_options=config["storage_options"])
        check_source(source)
        return cls(ObjectSource(source))

    @classmethod
    def mix(cls, datasets: Sequence[Dataset], weights: Sequence[float] | None = None, *,
            seed: int | None = None) -> Dataset:
        """Interleave `datasets` by `weights` (default equal), Grain's `MapDataset.mix`: the
        same order (seed None), or each period of the interleaving in a keyed random order
        (`seed`; the proportions stay exact). Ends before a finite input would run out;
        repeat the inputs for an endless mix. Inputs are index-level (source, shuffle,
        repeat, shard, slice): map, filter, batch and shard_by_jax_process() go after it.
        """
        datasets = mix_inputs(datasets, "mix", cls)
        props = proportions(weights, len(datasets))
        return cls(MixSpec(datasets, props, seed))

    @classmethod
    def concatenate(cls, datasets: Sequence[Dataset]) -> Dataset:
        """The finite `datasets` one after another (index-level inputs, as for `mix`); a
        repeat after it re-keys every input's shuffle, as Grain's does."""
        return cls(MixSpec(mix_inputs(datasets, "concatenate", cls)))

    # -- index ops --------------------------------------------------------------------

    def _index(self, op: IndexOp | JaxProcessShard) -> Dataset:
        if self.batching is not None:
            raise ValueError(f"{type(op).__name__.lower()}() must come before batch()/pack(): "
                             "it reorders records, not batches")
        return replace(self, index_ops=(*self.index_ops, op))

    def shuffle(self, seed: int, *, strategy: str = "exact", block_bytes: int | None = None,
                window_bytes: int | None = None, window: None = None) -> Dataset:
        """Exact global shuffle (a keyed permutation, re-keyed every epoch).

        `strategy="block"` trades randomness for I/O: the files are cut into blocks of whole
        chunks of about `block_bytes` (default 4 MiB), the blocks are put in a random order
        every epoch, and records are shuffled within windows of about `window_bytes` of
        decoded records (default 64 MiB of consecutive blocks, at least one). So reads are whole
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

    def block_shuffle(self, seed: int, *, block_bytes: int | None = None,
                      window_bytes: int | None = None) -> Dataset:
        """Shorthand for `shuffle(seed, strategy="block", block_bytes=..., window_bytes=...)`."""
        return self.shuffle(seed, strategy="block", block_bytes=block_bytes,
                            window_bytes=window_bytes)

    def repeat(self, num_epochs: int | None = None) -> Dataset:
        """Repeat the records `num_epochs` times (None: forever); shuffles re-key per epoch.
        An empty dataset repeated is empty; an endless one cannot be repeated (as Grain)."""
        op = Repeat(num_epochs)
        check_not_endless(self, "repeat()")
        return self._index(op)

    def shard(self, index: int, count: int, *, contiguous: bool = False,
              drop_remainder: bool = False) -> Dataset:
        """Keep shard `index` of `count` (strided by default)."""
        return self._index(Shard(index, count, contiguous, drop_remainder))

    def shard_by_jax_process(self, *, drop_remainder: bool = True,
                             sharding: Any = None) -> Dataset:
        """This process's shard of every global batch: processes whose devices hold the same
        rows of the batch's `sharding` (replicas over a 'model' axis) load the same rows, the
        others different ones; `.batch(n)`'s n is the global batch ÷ the number of such data
        slices (`aioloader.jax.data_slice`). The sharding is the one given to `to_jax`, or
        here; on several processes, a loader with neither refuses to start."""
        return self._index(jax_process_shard(drop_remainder, sharding))

    @overload
    def __getitem__(self, key: slice) -> Dataset: ...
    @overload
    def __getitem__(self, key: int) -> Any: ...
    @overload
    def __getitem__(self, key: Sequence[int]) -> list[Any]: ...

    def __getitem__(self, key: Any) -> Any:
        """`ds[a:b:c]`: a sliced Dataset. `ds[i]`, `ds[[i, j]]`: the elements the loader
        yields at those positions, computed in this process (pipelines of one-to-one ops
        only: source, shuffle, repeat, shard, slice, map, random_map)."""
        if isinstance(key, slice):
            return self._index(Slice(key.start, key.stop, key.step))
        from .access import access_of

        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return access_of(self).get([int(key)])[0]
        if isinstance(key, (str, bytes, bool)) or not hasattr(key, "__iter__"):
            raise TypeError(f"index a Dataset with an int, a list of ints or a slice, not "
                            f"{type(key).__name__}")
        return access_of(self).get(list(key))

    def __getitems__(self, keys: Sequence[int]) -> list[Any]:
        """The elements at `keys` (Grain and PyTorch samplers' batched fetch)."""
        from .access import access_of

        return access_of(self).get(list(keys))

    def __len__(self) -> int:
        """The number of elements the loader yields (one-to-one pipelines; finite)."""
        from .access import access_of

        return len(access_of(self))

    def __bool__(self) -> bool:  # a description is never "empty": `if ds:` opens nothing
        return True

    def __iter__(self) -> Iterator[Any]:
        """Iterate with a default loader (workers=0), closed when the iteration ends or is
        dropped."""
        loader = self.loader(workers=0)
        try:
            yield from loader
        finally:
            loader.close()

    # -- record ops -------------------------------------------------------------------

    def _record(self, op: RecordOp) -> Dataset:
        if self.batching is not None:
            if isinstance(op, MapOp):
                return replace(self, batch_ops=(*self.batch_ops, op))
            raise ValueError(f"{type(op).__name__} after batch()/pack() is not supported; "
                             "apply it before batching")
        return replace(self, record_ops=(*self.record_ops, op))

    def map(self, fn: Callable[[Any], Any]) -> Dataset:
        """Apply `fn` to every record (or, after batch(), to every batch). `fn`: a function,
        or an object with a `map` method (`aioloader.transforms.Map`, Grain's `Map`)."""
        return self._record(MapOp(transform_fn(fn, "map", "map")))

    def random_map(self, fn: Callable[[Any, Any], Any], *, seed: int | None = None) -> Dataset:
        """Apply `fn(element, rng)`; rng is a `np.random.Generator` keyed on the record. `fn`:
        a function, or an object with a `random_map` method (`RandomMap`, Grain's)."""
        fn = transform_fn(fn, "random_map", "random_map")
        if seed is None:
            seed = next((op.seed for op in self.index_ops if isinstance(op, Shuffle)), 0)
        return self._record(RandomMapOp(fn, seed))

    def filter(self, predicate: Callable[[Any], bool]) -> Dataset:
        """Keep records for which `predicate` is true. `predicate`: a function, or an object
        with a `filter` method (`aioloader.transforms.Filter`, Grain's `Filter`)."""
        return self._record(FilterOp(transform_fn(predicate, "filter", "filter")))

    def flat_map(self, fn: Callable[[Any], Any]) -> Dataset:
        """Replace every record by the elements `fn(record)` returns (an iterable: zero or
        more), in order. `fn`: a function, or an object with a `flat_map` method
        (`aioloader.transforms.FlatMap`, Grain's). Resume is exact mid-expansion; a
        record's elements are all made in one window's task, so keep the fan-out to what
        fits in memory (`window=` sets the records a window holds)."""
        return self._record(FlatMapOp(transform_fn(fn, "flat_map", "flat_map")))

    # -- batching ---------------------------------------------------------------------

    def batch(self, batch_size: int, *, drop_remainder: bool = False) -> Dataset:
        """Stack `batch_size` elements into one batch (dicts/tuples/arrays → stacked arrays)."""
        op = BatchOp(batch_size, drop_remainder)
        if isinstance(self.batching, PackOp) and self.pack_batch is None:
            return replace(self, pack_batch=op)
        if self.batching is not None:
            raise ValueError("batch() was already applied")
        return replace(self, batching=op)

    def pack(self, length_struct: Mapping[str, int], *, num_packing_bins: int) -> Dataset:
        """First-fit packing into rows of fixed lengths, with `*_segment_ids`/`*_positions`.

        Yields packed rows; follow with `.batch(n)` to stack them.
        """
        if self.batching is not None:
            raise ValueError("pack() must come before batch()")
        return replace(self, batching=PackOp(length_struct, num_packing_bins))

    # -- running ----------------------------------------------------------------------

    def loader(
        self,
        *,
        workers: int | Literal["auto"] | None = None,
        prefetch: int | Literal["auto"] | None = None,
        io_concurrency: int | Literal["auto"] | None = None,
        memory_budget: int | None = None,
        retry: RetryPolicy | None = None,
        max_gap: int | None = None,
        resident_bytes: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_bytes: int | None = None,
        index_cache_dir: str | os.PathLike | None = None,
        gcs_client: GcsClient | None = None,
        slot_size: int | None = None,
        window: int | None = None,
        read: ReadOptions | None = None,
        worker: WorkerOptions | None = None,
        options: LoaderOptions | None = None,
        state: Mapping[str, Any] | None = None,
        trace: bool | str | os.PathLike | None = None,
        **unknown: NoReturn,  # none: a type checker flags a misspelt option, and so do we
    ) -> Loader:
        """A running pipeline: `async with ds.loader() as it`, or `for batch in ds.loader()`.

        Each setting is documented in its group: `ReadOptions` (io_concurrency,
        memory_budget, retry, max_gap, resident_bytes, cache_dir, cache_bytes,
        index_cache_dir, gcs_client), `WorkerOptions` (workers, slot_size, window),
        `PrefetchOptions` (prefetch). Give them flat (`workers=2`), by group (`read=
        ReadOptions(...)`, `worker=WorkerOptions(...)`), or all at once (`options=
        LoaderOptions(...)`). The most specific wins: a flat setting overrides that field of
        its group, and `read=`/`worker=` replace that group of `options=`; None means "not
        given here". `state` is a `get_state()` dict to resume from.
        `trace` records a Chrome/Perfetto trace of the stages and workers
        (`it.stats().trace("trace.json")`; a path: written there on close; see
        `LoaderOptions`).
        """
        if unknown:
            valid = [p for p in inspect.signature(Dataset.loader).parameters
                     if p not in ("self", "unknown")]
            raise unknown_options_error(unknown, valid, "Dataset.loader()")
        if options is not None and not isinstance(options, LoaderOptions):
            raise TypeError(f"options must be an aioloader.LoaderOptions, got "
                            f"{type(options).__name__}")
        opts = (options if options is not None else LoaderOptions()).merged(
            read=read, worker=worker, workers=workers, prefetch=prefetch,
            io_concurrency=io_concurrency, memory_budget=memory_budget, retry=retry,
            max_gap=max_gap, resident_bytes=resident_bytes, cache_dir=cache_dir,
            cache_bytes=cache_bytes, index_cache_dir=index_cache_dir, gcs_client=gcs_client,
            slot_size=slot_size,
            window=window, trace=trace)
        # Imported here, not at the top: this module is the description and the runtime
        # builds on it (runtime.loader imports dataset), so importing it above would be a
        # circle, and describing a pipeline should not load the runtime.
        from .runtime.loader import Loader

        return Loader(self, opts, state=state)

    def check_picklable(self) -> None:
        """Raise a clear error, before any worker starts, when a transform cannot travel to
        worker processes (it holds a lock, an open file or socket...), or the source of a
        `from_source()` dataset cannot (workers read records from their own copy)."""
        check_picklable(self)

    def graph(self) -> str:
        """The pipeline drawn stage by stage, each with the type/shape/dtype of its first
        element (read in this process: `print(ds.graph())`)."""
        from .graph import draw

        return draw(self)

    def describe(self) -> list[str]:
        """The pipeline, one stage per line."""
        return stage_lines(self)
