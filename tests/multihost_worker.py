"""One process of a real multi-process JAX run (launched by tests/test_multihost.py).

    python -m tests.multihost_worker PORT NUM_PROCESSES PROCESS_ID CONFIG_JSON

Runs shard_by_jax_process() + to_jax(NamedSharding(mesh, P('data'))) over the dataset and
writes the gathered global batches (record ids) and the loader state to files.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

import aioloader as al
from tests import jax_job
from tests.pipeline_fns import decode, only_id_noise_det


def pipeline(cfg: dict, sharded: bool) -> al.Dataset:
    ds = al.Dataset.from_arrayrecord(cfg["urls"], storage_options=cfg["storage_options"])
    ds = ds.shuffle(cfg["seed"]).repeat(cfg["epochs"])
    if sharded:
        ds = ds.shard_by_jax_process()
    per_process = cfg["global_batch"] // (jax.process_count() if sharded else 1)
    return ds.map(decode).map(only_id_noise_det).batch(per_process, drop_remainder=True)


def main() -> None:
    i, cfg = jax_job.join()
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    state = cfg.get("state")
    loader = pipeline(cfg, sharded=True).loader(state=state, workers=0)
    batches = []
    it = loader.to_jax(sharding)
    for step, batch in enumerate(it):
        assert batch["id"].shape == (cfg["global_batch"],), batch["id"].shape
        batches.append(np.asarray(multihost_utils.process_allgather(batch["id"], tiled=True))
                       .tolist())
        if cfg.get("stop_after") is not None and step + 1 == cfg["stop_after"]:
            break
    state = it.get_state()  # after the last batch we used, not the prefetched ones
    it.close()
    if i == 0:
        with open(cfg["out"], "w") as f:
            json.dump({"batches": batches, "state": state,
                       "devices": jax.device_count(), "processes": jax.process_count()}, f)
    jax_job.leave()


if __name__ == "__main__":
    main()
