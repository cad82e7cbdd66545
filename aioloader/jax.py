"""JAX integration: batches as sharded `jax.Array`s, multi-host assembly, Orbax checkpoints.

This is the only module that imports jax (and orbax), and the package imports without them.

Loading strategy. Of the four ways to feed a sharded computation: (1) every
process loads the global batch and keeps its devices' slices; (2) one pipeline per device;
(3) one consolidated pipeline per process, assembled into global arrays; (4) load on one
process and scatter — aioloader implements (3): each process runs one pipeline over its
shard (`shard_by_jax_process()`), and `to_jax(sharding)` builds the global array with
`jax.make_array_from_process_local_data`. For a ('data', 'model') mesh the sharding
`NamedSharding(mesh, P('data'))` replicates rows over 'model', so devices of one model
replica see the same rows and different replicas different rows; when 'model' spans
processes, the processes of one replica must load the same rows, so shards are dealt by data
slice (`aioloader.index.dataslices`), learned from the sharding given to `to_jax` (or to
`shard_by_jax_process(sharding=)`) before the first batch.

Lockstep. Collectives hang if one process stops early. With `batch(drop_remainder=True)`
and `shard_by_jax_process()` (equal shards by default) every process yields the same number
of batches; otherwise `pad_final=True` pads every process to the longest shard's step count,
with zero rows and a boolean `mask` entry (dict batches), and without either the iterator
refuses to start on multi-process runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import Any

import numpy as np

from .describe.description import JaxProcessShard
from .describe.plan import needs_processes
from .describe.state import merge_states
from .elements.bucketing import BucketOp
from .elements.padding import pads_to_longest
from .elements.transforms import BatchOp
from .errors import MissingExtraError
from .index.dataslices import shard_of, table_of

try:
    import jax
except ImportError as exc:
    raise MissingExtraError("jax", "to_jax() and aioloader.jax", exc.name) from None


def process_index_and_count() -> tuple[int, int]:
    """This process's index and the process count of the JAX runtime."""
    return jax.process_index(), jax.process_count()


def data_slice(sharding: Any) -> tuple[int, int]:
    """`(index, count)` of this process's data slice under `sharding`: the rows of every
    global batch it loads with `shard_by_jax_process()` (`aioloader.index.dataslices`). The
    per-process batch is the global batch ÷ `count`."""
    return shard_of(table_of(sharding), *process_index_and_count())


def process_shard(dataset: Any) -> tuple[int, int] | None:
    """`(shard index, shard count)` of this process for `dataset`'s shard_by_jax_process():
    by the sharding it was given, or (0, 1) on one process; None when several processes
    wait for the one `to_jax` gives."""
    op = next(op for op in dataset.index_ops if isinstance(op, JaxProcessShard))
    index, count = process_index_and_count()
    if op.layout is not None:
        return shard_of(op.layout, index, count)
    return (0, 1) if count == 1 else None


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic))


def put_batch(batch: Any, sharding: Any = None) -> Any:
    """Place the array leaves of a batch on devices (non-array leaves are left as they are)."""
    multi = sharding is not None and jax.process_count() > 1

    def place(x: Any) -> Any:
        if not _is_array(x):
            return x
        if sharding is None:
            return jax.device_put(x)
        if multi:
            return jax.make_array_from_process_local_data(sharding, np.asarray(x))
        return jax.device_put(x, sharding)

    return jax.tree_util.tree_map(place, batch, is_leaf=lambda x: isinstance(x, list))


def _rows(batch: Any) -> int:
    leaves = [x for x in jax.tree_util.tree_leaves(batch) if _is_array(x)]
    return int(leaves[0].shape[0]) if leaves else 0


def _pad(batch: Any, rows: int) -> Any:
    """Pad a dict batch to `rows` rows with zeros and a `mask` that marks real rows."""
    if not isinstance(batch, dict):
        raise TypeError("pad_final=True needs dict batches (it adds a 'mask' entry)")
    have = _rows(batch)

    def pad(x: Any) -> Any:
        if not _is_array(x):
            return x
        x = np.asarray(x)
        extra = np.zeros((rows - x.shape[0], *x.shape[1:]), dtype=x.dtype)
        return np.concatenate([x, extra])

    out = {k: pad(v) for k, v in batch.items()}
    out["mask"] = np.arange(rows) < have
    return out


def multi_process_refusal(batching: Any) -> str | None:
    """Why batches of `batching` cannot be global arrays on a multi-process run (None if
    they can): `make_array_from_process_local_data` needs every process's batch to have
    one shape, step for step."""
    fixed = ("pad to a fixed length instead, pad={'tokens': 128} (per field) or pad=128, "
             "with truncate=True to cut longer elements")
    if isinstance(batching, BucketOp):
        return ("bucket_by_length() yields its buckets' batches, each process as its own "
                "share fills them: their number and shapes differ between processes, so "
                "multi-process steps cannot stay in lockstep; use batch(n, pad=...) with "
                f"fixed lengths ({fixed}), or bucket on one process")
    if isinstance(batching, BatchOp) and pads_to_longest(batching.rules):
        return ("batch(pad=True) pads to the longest element of each process's own batch, "
                "so processes can have batches of different shapes, which a multi-process "
                f"global array cannot hold: {fixed}")
    return None


class Placement:
    """What the placement thread runs: padding, lockstep fillers, `put_batch`. It holds no
    reference to the iterator it serves, so an iterator dropped unclosed is collected (and
    its thread told to stop)."""

    def __init__(self, loader: Any, sharding: Any, pad_final: bool) -> None:
        if sharding is not None and needs_processes(loader.dataset):
            loader.use_data_slice(data_slice(sharding))  # before the state is read
        self.loader = loader
        self.sharding = sharding
        self.pad_final = pad_final
        self.steps: int | None = None  # lockstep target when padding
        self.done = 0  # batches placed
        self.template: Any = None
        # jax's settings are per thread (x64, the default device, ...): placement, on a
        # thread of its own, runs under those in force where to_jax() is called
        self.settings = _thread_settings()
        self.differ: list[tuple[Any, Any]] | None = None  # those unlike the placing thread's

    async def setup(self) -> None:
        multi = jax.process_count() > 1
        batching = self.loader.dataset.batching
        drop = getattr(batching, "drop_remainder", False)
        why = multi_process_refusal(batching) if multi else None
        if why is not None:
            raise ValueError(why)
        if self.pad_final:
            self.steps = await self.loader.num_batches(longest_shard=True)
            self.size = batching.size
        elif multi and not drop:
            raise ValueError(
                "on multi-process runs every process must yield the same number of equal "
                "batches: use batch(..., drop_remainder=True), or to_jax(pad_final=True)"
            )

    def filler(self) -> Any | None:
        """An all-padding host batch while this process is behind the lockstep count."""
        if self.steps is None or self.done >= self.steps or self.template is None:
            return None
        return {k: (np.zeros_like(v) if _is_array(v) else v) for k, v in self.template.items()}

    def place(self, batch: Any, real: bool = True) -> Any:
        """`batch` (a filler unless `real`) on the devices; an error names the batch."""
        try:
            if self.pad_final and real:
                batch = _pad(batch, self.size)
                self.template = batch
            if self.differ is None:  # (the placing thread's own settings never change)
                self.differ = _differing(self.settings)
            with contextlib.ExitStack() as stack:
                for state, value in self.differ:
                    stack.enter_context(state(value))
                arrays = put_batch(batch, self.sharding)
        except Exception as exc:
            note = (f"aioloader: while placing batch {self.done} (counted from 0) of to_jax() "
                    "on the devices")
            if sys.version_info >= (3, 11):
                exc.add_note(note)
            else:  # kept, though not printed
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
            raise
        self.done += 1
        return arrays


def _thread_settings() -> dict[str, Any]:
    """The values of jax's per-thread settings in force on this thread (`jax.enable_x64`,
    `jax.default_device`, ...): jax keeps each as a state object that is also its context
    manager. Only the default device where jax's internals are not as expected."""
    try:
        from jax._src.config import State

        states = {n: h for n, h in jax.config._value_holders.items() if isinstance(h, State)}
        return {n: (h, h.value) for n, h in states.items()}
    except (ImportError, AttributeError):  # another jax: the default device at least
        device = getattr(jax.config, "jax_default_device", None)
        return {} if device is None else {"jax_default_device": (jax.default_device, device)}


def _differing(settings: dict[str, Any]) -> list[tuple[Any, Any]]:
    """The settings of `_thread_settings` whose value differs on this thread."""
    return [(state, value) for state, value in settings.values()
            if getattr(state, "value", object()) != value]


# -- Orbax ------------------------------------------------------------------------------

try:
    import orbax.checkpoint as ocp
    from etils import epath
except ImportError:  # orbax is optional
    ocp = None

if ocp is not None:

    class LoaderCheckpointHandler(ocp.CheckpointHandler):
        """Saves each process's loader state as `process_{i}-of-{n}.json`.

        Restoring on a different process count (elastic resume), or wherever data slices
        were saved (the mesh may lay them out anew on the same processes), reads every
        process's file and merges them (`merge_states`), one per data slice
        (`slice_{i}-of-{n}.json` says each process's; replicas hold the same state): with
        batch() alone the states of all processes describe the same global step, but with
        filter, flat_map or pack each slice has consumed its own share.
        """

        def save(self, directory: epath.Path, args: LoaderSave) -> None:
            state = args.loader.get_state() if hasattr(args.loader, "get_state") \
                else dict(args.loader)
            i, n = process_index_and_count()
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"process_{i}-of-{n}.json").write_text(json.dumps(state))
            shard = getattr(getattr(args.loader, "loader", args.loader), "data_slice", None)
            if shard is not None:  # processes of one data slice saved one state between them
                (directory / f"slice_{i}-of-{n}.json").write_text(json.dumps(list(shard)))

        def restore(self, directory: epath.Path, args: LoaderRestore | None = None) -> Any:
            i, n = process_index_and_count()
            path = directory / f"process_{i}-of-{n}.json"
            if path.exists():
                old = n
            else:
                found = sorted(directory.glob("process_0-of-*.json"))
                if not found:
                    raise FileNotFoundError(f"no loader state in {directory}")
                old = int(found[0].name.rsplit("-of-", 1)[1].split(".")[0])
            if old == n and not (directory / f"slice_0-of-{n}.json").exists():
                state = json.loads(path.read_text())  # saved without data slices
            else:  # this process's slice may be another than it was: from every slice's
                state = merge_states(_one_per_slice(directory, old))
            if args is not None and args.loader is not None:
                args.loader.set_state(state)
            return state

    def _one_per_slice(directory: epath.Path, count: int) -> list[dict[str, Any]]:
        """The states of a run of `count` processes, one per data slice in slice order
        (processes of one slice hold the same state; without `slice_*` files, as saved
        before data slices, each process is its own)."""
        kept: dict[int, dict[str, Any]] = {}
        for k in range(count):
            marker = directory / f"slice_{k}-of-{count}.json"
            index = json.loads(marker.read_text())[0] if marker.exists() else k
            if index not in kept:
                kept[index] = json.loads((directory / f"process_{k}-of-{count}.json")
                                         .read_text())
        return [kept[k] for k in sorted(kept)]

    @ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)
    @dataclasses.dataclass
    class LoaderSave(ocp.args.CheckpointArgs):
        """`ocp.args` for saving a loader's state beside the model."""

        loader: Any

    @ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)
    @dataclasses.dataclass
    class LoaderRestore(ocp.args.CheckpointArgs):
        """`ocp.args` for restoring; applies the state to `loader` when given."""

        loader: Any = None
