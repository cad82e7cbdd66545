"""Which rows of every global batch each JAX process loads: its *data slice* (pure).

A sharding splits the batch axis (dimension 0) of a global array into blocks of rows, and
each device holds one. Devices that hold the same block are replicas (over a 'model' axis,
say), and `jax.make_array_from_process_local_data` expects every process to pass the rows its
devices hold: processes whose devices hold the same blocks must load the *same* rows, the
others different rows. So `shard_by_jax_process()` deals shards by data slice, not by process:
a process's slice is the range of rows its devices cover; processes with the same range share
a shard index, and the shard count is the number of distinct ranges (the global batch is the
per-process batch times that count).

`slice_table` works on plain `(process, start, stop)` triples, so it is tested without JAX;
`device_rows` reads them off any JAX sharding by duck typing (`devices_indices_map` and each
device's `process_index`), so this module imports no JAX. Layouts a process cannot serve with
one contiguous range of rows, equal for all, are refused here, before any batch is read.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

MAX_NDIM = 8  # the most dimensions tried on a sharding that does not say its own


class LayoutError(ValueError):
    """A sharding whose batch rows cannot be dealt to processes as equal contiguous shards."""


def device_rows(sharding: Any) -> list[tuple[int, int, int]]:
    """`(process index, first row, end row)` of every device of `sharding`, for a global
    batch of `len(devices)` rows (a size every partition of dimension 0 divides)."""
    devices = getattr(sharding, "device_set", None)
    if devices is None or not hasattr(sharding, "devices_indices_map"):
        raise TypeError(f"expected a jax.sharding.Sharding (e.g. NamedSharding(mesh, "
                        f"P('data'))), got {type(sharding).__name__}")
    size = len(devices)
    spec = getattr(sharding, "spec", None)
    ranks = [max(1, len(spec))] if spec is not None else range(1, MAX_NDIM + 1)
    error: Exception | None = None
    for ndim in ranks:
        try:
            index_map = sharding.devices_indices_map((size,) * ndim)
            break
        except Exception as exc:  # wrong rank for this sharding: try the next
            error = exc
    else:
        raise LayoutError(f"cannot tell which rows each device of {sharding} holds: "
                          f"{error}") from None
    rows = []
    for device, index in index_map.items():
        cut = index[0]
        start, stop, _ = cut.indices(size)
        rows.append((int(device.process_index), start, stop))
    return rows


def table_of(sharding: Any) -> tuple[int, ...]:
    """Each process's data slice under `sharding` (`slice_table` of its `device_rows`)."""
    rows = device_rows(sharding)
    return slice_table(rows, 1 + max(p for p, _, _ in rows))


def slice_table(rows: Iterable[tuple[int, int, int]], process_count: int) -> tuple[int, ...]:
    """Each process's data slice (index `p` holds process p's), given every device's
    `(process, start, stop)` rows of one global batch; slices are numbered by their first
    row, so the shards come in the order of the global batch's rows."""
    held: dict[int, set[tuple[int, int]]] = {}
    rows = list(rows)
    size = max((stop for _, _, stop in rows), default=0)
    for process, start, stop in rows:
        held.setdefault(process, set()).add((start, stop))
    missing = [p for p in range(process_count) if p not in held]
    if missing:
        raise LayoutError(f"processes {missing} of {process_count} have no device in the "
                          "sharding: every process must hold part of the batch")
    spans = {}
    for process, blocks in sorted(held.items()):
        ordered = sorted(blocks)
        if any(a[1] != b[0] for a, b in itertools.pairwise(ordered)):
            raise LayoutError(
                f"the devices of process {process} hold rows {_rows(ordered)} of a global "
                f"batch of {size}, not one contiguous range: lay the mesh out so that each "
                "process's devices are neighbours along the batch axis (jax.make_mesh does)")
        spans[process] = (ordered[0][0], ordered[-1][1])
    distinct = sorted(set(spans.values()))
    total = max(stop for _, stop in distinct)
    width = distinct[0][1] - distinct[0][0]
    if any(b - a != width for a, b in distinct) or \
            [a for a, _ in distinct] != list(range(0, total, width)):
        raise LayoutError(
            f"processes hold unequal or overlapping ranges of a global batch of {size} ("
            + ", ".join(f"process {p}: {_rows([s])}" for p, s in sorted(spans.items()))
            + "): shard_by_jax_process() deals every process an equal shard")
    first = {span: k for k, span in enumerate(distinct)}
    return tuple(first[spans[p]] for p in range(process_count))


def shard_of(table: tuple[int, ...], process_index: int, process_count: int
             ) -> tuple[int, int]:
    """`(shard index, shard count)` of process `process_index` by `table`."""
    if len(table) != process_count:
        raise LayoutError(f"this data-slice layout is for {len(table)} processes, and this "
                          f"run has {process_count}: give a sharding of this run's mesh")
    return table[process_index], max(table) + 1


def unknown_layout_error(process_count: int) -> ValueError:
    """Why shard_by_jax_process() cannot start on several processes without a sharding."""
    return ValueError(
        f"shard_by_jax_process() on {process_count} JAX processes needs the batch's sharding "
        "to know which processes load the same rows (those whose devices hold the same rows "
        "of the batch axis, such as replicas over a 'model' axis that spans processes): "
        "iterate with loader.to_jax(sharding), or give it as "
        "shard_by_jax_process(sharding=NamedSharding(mesh, P('data')))")


def _rows(blocks: list[tuple[int, int]]) -> str:
    return ", ".join(f"[{a}:{b})" for a, b in blocks)
