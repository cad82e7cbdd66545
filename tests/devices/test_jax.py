"""Device placement on one process: shardings, data+model meshes, padding, Orbax, async."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

import aioloader as al

from ..support import pipeline_fns as fns

jax = pytest.importorskip("jax")
from aioloader.jax import multi_process_refusal  # noqa: E402  (needs jax)

NamedSharding = jax.sharding.NamedSharding
P = jax.sharding.PartitionSpec


def ids_pipeline(data, batch=8, drop=True):
    return (al.Dataset.from_arrayrecord(data).shuffle(3).map(fns.decode)
            .map(fns.only_id_noise_det).batch(batch, drop_remainder=drop))


def test_to_jax_places_batches_with_a_sharding(data):
    mesh = jax.make_mesh((4,), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    ref = [np.asarray(b["id"]) for b in ids_pipeline(data).loader()]
    got = list(ids_pipeline(data).loader().to_jax(sharding))
    assert len(got) == len(ref) == 12
    for g, r in zip(got, ref):
        assert isinstance(g["id"], jax.Array) and g["id"].sharding == sharding
        np.testing.assert_array_equal(np.asarray(g["id"]), r)
        assert len(g["id"].addressable_shards) == 4


def test_data_and_model_axes_replicate_rows_within_a_replica(data):
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    sharding = NamedSharding(mesh, P("data"))
    batch = next(iter(ids_pipeline(data).loader().to_jax(sharding)))
    rows = {}
    for shard in batch["id"].addressable_shards:
        coords = np.argwhere(mesh.devices == shard.device)[0]
        rows.setdefault(int(coords[0]), []).append(np.asarray(shard.data).tolist())
    # Devices of one data replica (same 'data' coordinate) hold the same rows ...
    for replica in rows.values():
        assert all(r == replica[0] for r in replica)
    # ... and different replicas hold different rows.
    assert rows[0][0] != rows[1][0]


def test_pad_final_masks_the_last_batch(data):
    got = list(ids_pipeline(data, batch=32, drop=False).loader().to_jax(pad_final=True))
    assert len(got) == 4
    assert [int(np.asarray(b["mask"]).sum()) for b in got] == [32, 32, 32, 4]
    assert all(b["id"].shape == (32,) for b in got)


def test_iterator_state_is_that_of_the_batches_returned(data):
    it = ids_pipeline(data).loader().to_jax(prefetch_to_device=3)
    seen = [np.asarray(next(it)["id"]).tolist() for _ in range(5)]
    state = it.get_state()
    it.close()
    rest = [np.asarray(b["id"]).tolist() for b in ids_pipeline(data).loader(state=state)]
    full = [np.asarray(b["id"]).tolist() for b in ids_pipeline(data).loader()]
    assert seen + rest == full


def test_async_to_jax(data):
    async def run():
        async with ids_pipeline(data).loader() as it:
            return [np.asarray(b["id"]) async for b in it.to_jax_async()]

    got = asyncio.run(run())
    ref = [np.asarray(b["id"]) for b in ids_pipeline(data).loader()]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


def test_orbax_saves_and_restores_the_loader_beside_the_model(tmp_path, data):
    ocp = pytest.importorskip("orbax.checkpoint")
    from aioloader.jax import LoaderRestore, LoaderSave

    full = [np.asarray(b["id"]).tolist() for b in ids_pipeline(data).loader()]
    params = {"w": np.arange(4.0)}
    it = ids_pipeline(data).loader().to_jax()
    seen = [np.asarray(next(it)["id"]).tolist() for _ in range(4)]
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(params),
                                             data=LoaderSave(it)))
        mngr.wait_until_finished()
    it.close()
    fresh = ids_pipeline(data).loader()
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        restored = mngr.restore(4, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(params), data=LoaderRestore(fresh)))
    np.testing.assert_array_equal(restored["state"]["w"], params["w"])
    rest = [np.asarray(b["id"]).tolist() for b in fresh]
    assert seen + rest == full


@pytest.mark.parametrize("make, refused", [
    (lambda ds: ds.batch(8, drop_remainder=True, pad=True), r"batch\(pad=True\) pads to the "
                                                            r"longest"),
    (lambda ds: ds.batch(8, drop_remainder=True, pad={"t": True, "u": 4}), "batch.pad=True"),
    (lambda ds: ds.bucket_by_length(len, [4], [2, 2], pad={"t": 8}), "bucket_by_length"),
    (lambda ds: ds.batch(8, drop_remainder=True, pad={"t": 16}), None),
    (lambda ds: ds.batch(8, drop_remainder=True, pad=16, truncate=True), None),
    (lambda ds: ds.batch(8, drop_remainder=True), None),
])
def test_multi_process_runs_refuse_shapes_that_vary_between_processes(make, refused):
    why = multi_process_refusal(make(al.Dataset.from_source([b"x"])).batching)
    if refused is None:
        assert why is None
        return
    assert why is not None and re.search(refused, why), why
    assert "pad={'tokens': 128} (per field) or pad=128" in why  # the fixed-length form
