"""One process of a real multi-process JAX run of a stream-mode pipeline (launched by
tests/devices/test_multihost.py's elastic filter/pack tests).

    python -m tests.support.elastic_stream_worker PORT NUM_PROCESSES PROCESS_ID CONFIG_JSON

Reads the shard_by_jax_process() pipeline (filter + pack, or filter + batch) on the host,
`stop` items or to the end, and writes the record ids it yielded to `out-{i}.json`. The
state is saved and restored through the Orbax handler (`aioloader.jax`), which merges the
old processes' states on another process count.
"""

from __future__ import annotations

import itertools
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import aioloader as al
from aioloader.jax import LoaderCheckpointHandler, LoaderRestore, LoaderSave
from tests.support import jax_job
from tests.support import pipeline_fns as fns


def pipeline(cfg: dict) -> al.Dataset:
    rows = NamedSharding(Mesh(jax.devices(), ("data",)), PartitionSpec("data"))
    ds = (al.Dataset.from_arrayrecord(cfg["paths"]).shuffle(5)
          .shard_by_jax_process(drop_remainder=False, sharding=rows)  # iterated on the host
          .map(fns.decode).filter(fns.keep_even))
    if cfg["kind"] == "pack":
        return ds.map(fns.id_tokens).pack({"tokens": 8}, num_packing_bins=3).batch(2)
    return ds.map(fns.just_id).batch(cfg["global_batch"] // jax.process_count())


def ids(item, kind: str) -> list[int]:
    return fns.packed_ids(item) if kind == "pack" else [int(x) for x in item.reshape(-1)]


def main() -> None:
    i, cfg = jax_job.join()
    loader = pipeline(cfg).loader(workers=cfg.get("workers", 0), window=cfg.get("window"))
    handler = LoaderCheckpointHandler()
    if cfg.get("restore"):
        handler.restore(epath.Path(cfg["restore"]), LoaderRestore(loader))
    stop = cfg.get("stop")
    got = []
    for item in (loader if stop is None else itertools.islice(loader, stop + i)):
        got += ids(item, cfg["kind"])
    if cfg.get("save"):
        handler.save(epath.Path(cfg["save"]), LoaderSave(loader))
    loader.close()
    with open(os.path.join(cfg["out"], f"out-{i}.json"), "w") as f:
        json.dump(got, f)
    jax_job.leave()


if __name__ == "__main__":
    main()
