"""One process of a real multi-process JAX run (launched by tests/devices/test_multihost.py).

    python -m tests.support.multihost_worker PORT NUM_PROCESSES PROCESS_ID CONFIG_JSON

Runs shard_by_jax_process() + to_jax(NamedSharding(mesh, spec)) over the dataset, on a 1-D
'data' mesh of every device or on the config's ('data', 'model') `mesh` (`transpose`: its
device grid laid out the other way, so that 'model' spans processes where it would not, and
back), and writes the gathered global batches (record ids) and the loader state to `out`, and
every process the rows each of its devices holds to `out.<process>`.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import aioloader as al
from aioloader.jax import data_slice
from tests.support import jax_job
from tests.support.pipeline_fns import decode, only_id_noise_det


def as_column(element: dict) -> dict:
    """The id as a (1,) array: a batch of them is 2-D, for a `P(('data',), None)` spec."""
    return {"id": np.asarray([element["id"]])}


def pipeline(cfg: dict, per_process: int) -> al.Dataset:
    ds = al.Dataset.from_arrayrecord(cfg["urls"], storage_options=cfg["storage_options"])
    ds = ds.shuffle(cfg["seed"]).repeat(cfg["epochs"]).shard_by_jax_process()
    ds = ds.map(decode).map(as_column if cfg.get("spec") == "tuple" else only_id_noise_det)
    return ds.batch(per_process, drop_remainder=True)


def sharding(cfg: dict) -> NamedSharding:
    devices = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    if cfg.get("mesh") is None:
        mesh = Mesh(devices, ("data",))
    else:
        d, m = cfg["mesh"]
        grid = devices.reshape(m, d).T if cfg.get("transpose") else devices.reshape(d, m)
        mesh = Mesh(grid, ("data", "model"))
    spec = PartitionSpec(("data",), None) if cfg.get("spec") == "tuple" else \
        PartitionSpec("data")
    return NamedSharding(mesh, spec)


def refusals(cfg: dict, per_process: int) -> dict[str, str]:
    """What each layout that cannot be served says before the first batch (a ValueError)."""
    odd = sorted(jax.devices(), key=lambda d: (d.id % 2, d.process_index))
    given = (al.Dataset.from_arrayrecord(cfg["urls"], storage_options=cfg["storage_options"])
             .shard_by_jax_process(sharding=sharding({**cfg, "transpose": True}))
             .batch(per_process, drop_remainder=True))
    cases = {
        # several processes, and no sharding to tell which of them share rows
        "unknown": (pipeline(cfg, per_process), None),
        # each process's devices 1st and 3rd along the batch axis: not one range of rows
        "interleaved": (pipeline(cfg, per_process),
                        NamedSharding(Mesh(np.array(odd), ("data",)), PartitionSpec("data"))),
        # shard_by_jax_process(sharding=) and to_jax() with other data slices
        "mismatch": (given, sharding(cfg)),
    }
    said = {}
    for name, (ds, place) in cases.items():
        loader = ds.loader(workers=0)
        try:
            next(iter(loader if place is None else loader.to_jax(place)))
        except ValueError as exc:
            said[name] = str(exc)
        finally:
            loader.close()
    return said


def main() -> None:
    i, cfg = jax_job.join()
    place = sharding(cfg)
    index, count = data_slice(place)
    assert count == cfg["slices"], (index, count)
    per_process = cfg["global_batch"] // count
    said = refusals(cfg, per_process) if cfg.get("refusals") else {}
    loader = pipeline(cfg, per_process).loader(state=cfg.get("state"), workers=0)
    batches, shards, states, shapes = [], [], {}, set()
    it = loader.to_jax(place)
    for step, batch in enumerate(it):
        ids = batch["id"]
        shapes.add(tuple(ids.shape))
        shards.append([[s.device.id, s.index[0].start or 0, np.asarray(s.data).reshape(-1)
                        .tolist()] for s in ids.addressable_shards])
        batches.append(np.asarray(multihost_utils.process_allgather(ids, tiled=True))
                       .reshape(-1).tolist())
        states[step + 1] = it.get_state()  # after the last batch used, not the prefetched
        if cfg.get("stop_after") is not None and step + 1 == cfg["stop_after"]:
            break
    it.close()
    with open(f"{cfg['out']}.{i}", "w") as f:
        json.dump(shards, f)
    if i == 0:
        with open(cfg["out"], "w") as f:
            json.dump({"batches": batches, "states": {k: states[k] for k in
                                                      cfg.get("keep_states", [])},
                       "state": states[len(batches)] if batches else None,
                       "shapes": sorted(shapes), "refusals": said,
                       "devices": jax.device_count(), "processes": jax.process_count()}, f)
    jax_job.leave()


if __name__ == "__main__":
    main()
