"""`Dataset`: the declarative, immutable, picklable description of a pipeline.

Each verb returns a new `Dataset`; nothing runs until `.loader()`. What it holds and the verbs
that add to it are `Stages` (`stages`, pure); this module adds the constructors and the
methods that reach above the description's layer, lazily and only here: `loader()`, `ds[i]`,
`len(ds)` and `graph()` start the runtime, and `from_arrayrecord(decode="auto")` /
`from_source(ArrayRecordSource)` open the files they were asked to read.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

import numpy as np

from .. import formats as fmts
from ..arrayrecord.levels import DEFAULT_VERIFY
from ..elements.transforms import MapOp
from ..index.sampling import Slice
from ..index.selection import proportions
from ..options import (
    GcsClient,
    LoaderOptions,
    ReadOptions,
    RetryPolicy,
    WorkerOptions,
    unknown_options_error,
)
from ..urls import has_glob, is_gcs
from .description import MixSpec, SourceSpec
from .mixed import mix_inputs
from .objects import ObjectSource, check_source
from .stages import Stages

if TYPE_CHECKING:
    from ..runtime.loader import Loader


@dataclass(frozen=True, repr=False)
class Dataset(Stages):
    """An immutable, picklable description of a pipeline: source → index ops → record ops →
    batching.

    Build one with `from_arrayrecord`, `from_tfrecord`, `from_source`, `mix` or
    `concatenate`, chain verbs
    (`shuffle`, `repeat`, `shard`, `shard_by_jax_process`, slicing, `map`, `random_map`,
    `flat_map`, `filter`, `pack`, `batch`, `bucket_by_length`), each returning a new
    `Dataset`, and run it with
    `loader()`. Nothing is read until then, so a description can be built anywhere (before
    `jax.distributed` starts) and sent to other processes. Pipelines of one-to-one steps are
    also random access: `len(ds)`, `ds[i]`, `ds[[i, j]]` give the elements the loader yields
    at those positions.
    """

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
        that the files' recorded element spec describes (`aioloader.elements.typed`; written by
        `convert --from npy`, `--decode-examples`, or `ArrayRecordWriter(element_spec=)`):
        it opens the files' footers now to read it. `decode=spec` (an `ElementSpec` or its
        JSON) uses that spec without opening anything. `verify` is `ArrayRecordSource`'s:
        "all" (every stored hash, chunk data included), "headers" or "none".
        """
        source = SourceSpec(paths, storage_options or {}, verify)  # type: ignore[arg-type]
        if any(is_gcs(p) and has_glob(p) for p in source.paths):
            from ..preimport import import_started

            import_started("gcsfs")  # its listing needs gcsfs: import it while the rest starts
        if decode is None:
            return cls(source)
        from ..elements.typed import Decode, ElementSpec
        from ..source import recorded_spec  # opening files only when asked to

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
    def from_tfrecord(
        cls,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        compression: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        verify: str = DEFAULT_VERIFY,
    ) -> Dataset:
        """Records of TFRecord files (each record's payload, as bytes): a path, URL, glob,
        or a list of them, as `from_arrayrecord` takes (`[start:end]` included).

        TFRecord files have no index: the loader scans each file once when it opens it (a
        sequential read of the whole file; keep the result with `index_cache_dir`), then
        reads every record by its own byte range, so every verb works as over ArrayRecord
        files (see docs/formats.md). `compression` must be None: GZIP/ZLIB-compressed
        files have no random access (convert them with `aioloader convert`). `verify`:
        "all" checks each record's payload checksum, "headers" only its length's, "none"
        neither.
        """
        from ..formats.tfrecord import check_compression

        check_compression(compression)
        source = SourceSpec(paths, storage_options or {}, verify,  # type: ignore[arg-type]
                            "tfrecord")
        if any(is_gcs(p) and has_glob(p) for p in source.paths):
            from ..preimport import import_started

            import_started("gcsfs")
        return cls(source)

    @classmethod
    def from_parquet(
        cls,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        verify: str = DEFAULT_VERIFY,
    ) -> Dataset:
        """Rows of Parquet files: a path, URL, glob, or a list of them, as
        `from_arrayrecord` takes (`[start:end]` takes rows start..end-1 of one file). An
        element is one row, a dict column name -> value (`ParquetSource`); `columns` (None:
        all) are the top-level columns read, and only theirs are decoded.

        A row group plays the part of a large ArrayRecord chunk: opening reads each
        file's footer (cached with `index_cache_dir`, per column selection), a row group is
        fetched as one byte range and decoded in the workers, and every verb (shuffles,
        repeat, shard, mix, resume) works as over ArrayRecord files (see docs/formats.md).
        Damaged or lying files raise `ParquetFormatError` naming the file and row group.
        """
        kind = fmts.reading("parquet", None if columns is None else list(columns))
        source = SourceSpec(paths, storage_options or {}, verify,  # type: ignore[arg-type]
                            kind)
        if any(is_gcs(p) and has_glob(p) for p in source.paths):
            from ..preimport import import_started

            import_started("gcsfs")
        return cls(source)

    @classmethod
    def from_source(cls, source: Any) -> Dataset:
        """Records of any object with `__len__` and `__getitem__`: a Grain data source, a
        list of records, ours.

        An `ArrayRecordSource` reads as `from_arrayrecord` would (its files, through the
        loader's own reads). Any other object is read by index where records are decoded
        (`aioloader.describe.objects`): each worker process gets a pickled copy of it (so it must
        pickle, and a list's records travel with it), `workers=0` reads it in place.
        """
        from ..source import ArrayRecordSource  # describing a pipeline imports no I/O

        if isinstance(source, ArrayRecordSource):  # (TFRecordSource too: its format kept)
            config = source._config  # what a copy of it reopens: its paths and options
            return cls(SourceSpec(config["paths"], dict(config["storage_options"] or {}),
                                  config["verify"], tuple(source.formats)))
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
        index_cache_dir: str | os.PathLike | Literal[False] | None = None,
        spill_dir: str | os.PathLike | None = None,
        spill_bytes: int | None = None,
        gcs_client: GcsClient | None = None,
        slot_size: int | None = None,
        window: int | None = None,
        executor: Literal["processes", "threads", "ray"] | Any = None,
        first_in_parent: bool | None = None,
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
        index_cache_dir, spill_dir, spill_bytes, gcs_client), `WorkerOptions` (workers,
        slot_size, window, executor, first_in_parent), `PrefetchOptions` (prefetch). Give
        them flat (`workers=2`), by group (`read=ReadOptions(...)`,
        `worker=WorkerOptions(...)`), or all at once (`options=LoaderOptions(...)`). The most
        specific wins: a flat setting overrides that field of its group, and
        `read=`/`worker=` replace that group of `options=`; None means "not given here".
        `state` is a `get_state()` dict to resume from.
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
            cache_bytes=cache_bytes, index_cache_dir=index_cache_dir, spill_dir=spill_dir,
            spill_bytes=spill_bytes, gcs_client=gcs_client,
            slot_size=slot_size, window=window, executor=executor,
            first_in_parent=first_in_parent, trace=trace)
        # Imported here, not at the top: this module is the description and the runtime
        # builds on it (runtime.loader imports dataset), so importing it above would be a
        # circle, and describing a pipeline should not load the runtime.
        from ..runtime.loader import Loader

        return Loader(self, opts, state=state)

    def graph(self) -> str:
        """The pipeline drawn stage by stage, each with the type/shape/dtype of its first
        element (read in this process: `print(ds.graph())`)."""
        from ..runtime.graph import draw

        return draw(self)

    # -- random access ----------------------------------------------------------------

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
        from ..runtime.access import access_of

        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return access_of(self).get([int(key)])[0]
        if isinstance(key, (str, bytes, bool)) or not hasattr(key, "__iter__"):
            raise TypeError(f"index a Dataset with an int, a list of ints or a slice, not "
                            f"{type(key).__name__}")
        return access_of(self).get(list(key))

    def __getitems__(self, keys: Sequence[int]) -> list[Any]:
        """The elements at `keys` (Grain and PyTorch samplers' batched fetch)."""
        from ..runtime.access import access_of

        return access_of(self).get(list(keys))

    def __len__(self) -> int:
        """The number of elements the loader yields (one-to-one pipelines; finite)."""
        from ..runtime.access import access_of

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
