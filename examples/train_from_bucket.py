"""Train a small model from a bucket: sharded batches, Orbax checkpoints, exact resume.

    python examples/train_from_bucket.py [gs://bucket/train-*.array_record] [--steps N]

With no URL, a local GCS emulator is started and the sample dataset (examples/
write_sample.py) is uploaded to it, so the whole run goes over real HTTP. Half way through,
the run is "interrupted": the model and the loader state are checkpointed together with
Orbax, everything is torn down, restored, and training continues from the same batch.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from common import VOCAB, parse, to_fixed
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import aioloader as al
from aioloader.jax import LoaderRestore, LoaderSave

HERE = os.path.dirname(os.path.abspath(__file__))


def init_params(key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {"embed": jax.random.normal(k1, (VOCAB, 32)) * 0.1,
            "out": jax.random.normal(k2, (32, 4)) * 0.1}


def loss_fn(params: dict, batch: dict) -> jax.Array:
    mask = (batch["tokens"] > 0)[..., None]
    # Rows of the embedding, sharded like the batch ('data'); the table stays replicated.
    rows = params["embed"].at[batch["tokens"]].get(out_sharding=jax.typeof(mask).sharding)
    emb = (rows * mask).sum(1) / jnp.maximum(mask.sum(1), 1)
    logits = emb @ params["out"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()


def make_step(opt: optax.GradientTransformation):
    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def pipeline(url: str, storage_options: dict, batch: int) -> al.Dataset:
    return (al.Dataset.from_arrayrecord(url, storage_options=storage_options)
            .shuffle(seed=0).repeat().shard_by_jax_process()
            .map(parse).map(to_fixed).batch(batch, drop_remainder=True))


def train(loader_iter, params, opt_state, step_fn, steps: int, log_every: int):
    """Run `steps` steps; return params, opt state and (records, seconds)."""
    t0 = time.perf_counter()
    records = 0
    for k in range(steps):
        batch = next(loader_iter)
        params, opt_state, loss = step_fn(params, opt_state, batch)
        records += int(batch["label"].shape[0])
        if (k + 1) % log_every == 0:
            print(f"  step {k + 1:4d}  loss {float(loss):.3f}")
    jax.block_until_ready(params)
    return params, opt_state, records, time.perf_counter() - t0


@contextlib.contextmanager
def dataset_url(url: str | None, records: int):
    """The given URL, or the sample dataset uploaded to a local emulator."""
    if url:
        yield url, {}
        return
    from aioloader.testing import local_gcs

    local = os.path.join("data", "sample")
    if not glob.glob(os.path.join(local, "train-*.array_record")):
        subprocess.run([sys.executable, os.path.join(HERE, "write_sample.py"), local,
                        "--records", str(records)], check=True)
    with local_gcs() as gcs:
        for path in sorted(glob.glob(os.path.join(local, "train-*.array_record"))):
            gcs.upload(path, f"sample/{os.path.basename(path)}")
        print(f"serving {local}/ from a local GCS emulator at {gcs.endpoint}")
        yield gcs.url("sample/train-*.array_record"), gcs.storage_options


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", nargs="?", help="gs:// glob (default: a local emulator)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256, help="global batch size")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--records", type=int, default=100_000, help="sample size to write")
    args = p.parse_args()

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    opt = optax.adam(1e-2)
    step_fn = make_step(opt)
    per_process = args.batch // jax.process_count()
    first, second = args.steps // 2, args.steps - args.steps // 2

    with dataset_url(args.url, args.records) as (url, opts), \
            tempfile.TemporaryDirectory() as ckpt_dir, jax.set_mesh(mesh):
        ds = pipeline(url, opts, per_process)
        replicated = NamedSharding(mesh, P())
        params = jax.device_put(init_params(jax.random.key(0)), replicated)
        opt_state = opt.init(params)
        # One set of loader options, for the loader before the checkpoint and the one after.
        # A bucket far away wants more range reads in flight than the default 64.
        options = al.LoaderOptions(read=al.ReadOptions(io_concurrency=128),
                                   worker=al.WorkerOptions(workers=args.workers),
                                   prefetch=al.PrefetchOptions(prefetch=4))

        # Part 1: train, then checkpoint model + loader together.
        loader = ds.loader(options=options)
        loader.start_prefetch()  # overlaps opening the bucket with compiling the step
        it = loader.to_jax(sharding)
        print(f"training {first} steps from {url}")
        params, opt_state, n1, s1 = train(it, params, opt_state, step_fn, first, 50)
        stats = loader.stats()
        ttfb = stats.first_batch_seconds
        wait1 = stats.wait_seconds
        with ocp.CheckpointManager(ckpt_dir) as mngr:
            mngr.save(first, args=ocp.args.Composite(
                model=ocp.args.StandardSave({"params": params, "opt": opt_state}),
                data=LoaderSave(it)))
            mngr.wait_until_finished()
        it.close()  # "preempted"
        print(f"checkpointed at step {first}; loader state {it.get_state()['position']} "
              "positions in; restarting")

        # Part 2: a fresh loader and model, restored from the checkpoint.
        loader = ds.loader(options=options)
        with ocp.CheckpointManager(ckpt_dir) as mngr:
            restored = mngr.restore(first, args=ocp.args.Composite(
                model=ocp.args.StandardRestore({"params": params, "opt": opt_state}),
                data=LoaderRestore(loader)))
        params, opt_state = restored["model"]["params"], restored["model"]["opt"]
        it = loader.to_jax(sharding)
        params, opt_state, n2, s2 = train(it, params, opt_state, step_fn, second, 50)
        stats = loader.stats()
        it.close()

        records, seconds = n1 + n2, s1 + s2
        waited = wait1 + stats.wait_seconds
        print()
        print(f"throughput        {records / seconds:,.0f} records/s "
              f"({records:,} records, {args.steps} steps, {seconds:.1f} s)")
        print(f"time to 1st batch {ttfb:.3f} s")
        print(f"waiting for data  {100 * waited / seconds:.1f}% of training time")
        print()
        print(stats)


if __name__ == "__main__":
    main()
