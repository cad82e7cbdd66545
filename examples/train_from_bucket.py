"""Train a small model from a bucket: sharded batches, a checkpoint, exact resume.

    python examples/train_from_bucket.py [gs://bucket/train-*.array_record] [--steps N]

With no URL, a local GCS emulator is started and the sample dataset (examples/
write_sample.py) is uploaded to it, so the whole run goes over real HTTP. Half way through,
the run is "interrupted": the model and the loader state are checkpointed together (the
arrays in an .npz, the loader's state -- a few integers -- as JSON), everything is torn down,
restored, and training continues from the same batch. This is `make demo`, which installs
only what it imports (the `demo` extra); with Orbax, `aioloader.jax.LoaderSave` and
`LoaderRestore` put the loader in the same checkpoint as the model
(examples/nnx_sharded_training.py, docs/checkpointing.md).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import VOCAB, parse, to_fixed
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import aioloader as al
from aioloader.jax import data_slice

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


class Part:
    """What one stretch of training measured: steps, records, its time, its wait for data."""

    def __init__(self, first_step: int, steps: int) -> None:
        self.first_step, self.steps = first_step, steps
        self.records, self.seconds = 0, 0.0
        self.startup = 0.0  # loader made -> first batch in hand
        self.life = 0.0  # the loader's life so far: made -> the end of this part
        self.waited = 0.0  # the time the step loop waited in next() (the loader's count)
        self.first_wait = 0.0  # of it, the first next(): the loader's start-up, less overlap
        self.workers = 0  # decode workers at the end of the part (as tuned, with "auto")
        self.table = ""  # the loader's stats table, taken at the end of this part

    def took_stats(self, stats) -> None:
        """The loader's figures now (they run on with its clock after the part ends)."""
        d = stats.as_dict()
        self.startup = d["time_to_first_batch_s"] or 0.0
        self.life = d["elapsed_s"]
        self.waited = d["wait_s"]
        self.workers = d.get("autotune", {}).get("workers", self.workers)
        self.table = str(stats)

    @property
    def span(self) -> str:
        return f"steps {self.first_step + 1}-{self.first_step + self.steps}"


def train(loader_iter, params, opt_state, step_fn, part: Part, log_every: int,
          step_seconds: float):
    """Run `part.steps` steps, numbered on from `part.first_step`.

    `step_seconds` stands in for a model of realistic size: the accelerator busy that long per
    step while the host is free (a sleep), which is when the loader prepares the next batches.
    """
    t0 = time.perf_counter()
    for k in range(part.first_step, part.first_step + part.steps):
        t = time.perf_counter()
        batch = next(loader_iter)
        if k == part.first_step:
            part.first_wait = time.perf_counter() - t
        params, opt_state, loss = step_fn(params, opt_state, batch)
        if step_seconds:
            time.sleep(step_seconds)
        part.records += int(batch["label"].shape[0])
        if (k + 1) % log_every == 0:
            print(f"  step {k + 1:4d}  loss {float(loss):.3f}")
    jax.block_until_ready(params)
    part.seconds = time.perf_counter() - t0
    return params, opt_state


def report(parts: list[Part], batch: int, step_ms: float, auto: bool) -> None:
    """Every figure with what it measures; the loader's own table for each part's span."""
    rows = [("", *(p.span for p in parts), "all")]
    total = Part(0, sum(p.steps for p in parts))
    total.records = sum(p.records for p in parts)
    total.seconds = sum(p.seconds for p in parts)
    total.waited = sum(p.waited for p in parts)
    total.first_wait = sum(p.first_wait for p in parts)
    rows.append(("training throughput", *(f"{p.records / p.seconds:,.0f} rec/s"
                                          for p in [*parts, total])))
    rows.append(("time in the step loop", *(f"{p.seconds:.1f} s" for p in [*parts, total])))
    rows.append(("waiting for data", *(f"{100 * p.waited / p.seconds:.1f}%"
                                       for p in [*parts, total])))
    rows.append(("  for the first batch", *(f"{100 * p.first_wait / p.seconds:.1f}%"
                                           for p in [*parts, total])))
    rows.append(("  after it", *(f"{100 * max(0.0, p.waited - p.first_wait) / p.seconds:.1f}%"
                                 for p in [*parts, total])))
    rows.append(("loader start-up", *(f"{p.startup:.2f} s" for p in parts), ""))
    rows.append(("decode workers", *(str(p.workers) for p in parts), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    print("""
  training throughput: records the steps consumed / time in the step loop
  waiting for data:    share of that time the step loop waited for the next batch (the
                       tables' "consumer waited"); near 0% means the loader keeps up.
    for the first batch: the first step's wait, while the loader opens the bucket, reads the
                       first records and starts its workers (after the checkpoint: from the
                       restored state, while the model is restored; the step is compiled)
    after it:          the steady state, the figure that says whether the loader keeps up
  loader start-up:     from making the loader to its first batch, overlapping the first
                       step's compilation (start_prefetch)
  decode workers:      worker processes at the end of the part: workers="auto" starts with
                       one and adds one while the step waits on decoding and a core is free""")
    steady = max(0.0, total.waited - total.first_wait) / total.seconds
    per_step = 1e3 * total.seconds / total.steps
    rate = total.records / total.seconds
    workers = max(p.workers for p in parts)
    if steady < 0.05:
        verdict = (f"-> the loader keeps up: a step takes {per_step:.0f} ms ({step_ms:g} ms of "
                   "it simulated model compute, --step-ms), and after the first batch the next "
                   f"one is ready when the step asks ({100 * steady:.1f}% waiting). The first "
                   "batch is the only wait: opening the bucket and starting the workers, "
                   "overlapped with compiling the step.")
    else:
        verdict = (f"-> the loader sets the pace: after the first batch the steps still wait "
                   f"{100 * steady:.0f}% of the time. A step takes {per_step:.0f} ms, of "
                   f"which {step_ms:g} ms simulated model compute (--step-ms); {workers} "
                   f"decode worker{'s' if workers != 1 else ''} parse about {rate:,.0f} JSON "
                   f"records/s on this machine, and each step takes {batch}. "
                   + (f"The cores are the limit here ({os.cpu_count()} on this machine, shared "
                      "with the training step and anything else running): workers=\"auto\" "
                      "adds a worker only while a core is free, and with more free cores the "
                      "wait goes away." if auto else
                      "More --workers (a core each), --workers auto, or a larger model "
                      "(--step-ms) make the wait go away.")
                   + " 'batches ready' near 0 in the tables says the same.")
    print(textwrap.fill(verdict, 96, initial_indent="  ", subsequent_indent="     "))
    for part, name in zip(parts, ("before", "after")):
        print()
        print(textwrap.fill(
            f"loader stats for {part.span}, from the loader {name} the checkpoint, over its "
            f"life: {part.life:.1f} s from its creation to the end of these steps, the span "
            f"of their {part.seconds:.1f} s step loop above. 'consumer waited': the time the "
            "steps waited for a batch; 'batches ready': how many of the prefetched batches "
            "were finished when a step asked, on average.", 96))
        print(part.table)

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


def workers_arg(text: str) -> int | str:
    return text if text == "auto" else int(text)


def save(ckpt_dir: str, tree, loader_state: dict) -> None:
    """The model's arrays in one .npz, the loader's state (a few integers) as JSON."""
    leaves = jax.tree.leaves(tree)
    np.savez(os.path.join(ckpt_dir, "model.npz"),
             **{f"leaf{i}": np.asarray(x) for i, x in enumerate(leaves)})
    with open(os.path.join(ckpt_dir, "loader.json"), "w") as f:
        json.dump(loader_state, f)


def restore_loader_state(ckpt_dir: str) -> dict:
    with open(os.path.join(ckpt_dir, "loader.json")) as f:
        return json.load(f)


def restore_model(ckpt_dir: str, like, sharding):
    """The model's arrays, in the structure of `like`, placed as `sharding`."""
    with np.load(os.path.join(ckpt_dir, "model.npz")) as z:
        leaves = [z[f"leaf{i}"] for i in range(len(z.files))]
    return jax.device_put(jax.tree.unflatten(jax.tree.structure(like), leaves), sharding)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", nargs="?", help="gs:// glob (default: a local emulator)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256, help="global batch size")
    p.add_argument("--workers", type=workers_arg, default="auto",
                   help='decode worker processes, or "auto" (the default): start with one '
                        "and add one while the step waits on decoding and a core is free")
    p.add_argument("--records", type=int, default=100_000, help="sample size to write")
    p.add_argument("--step-ms", type=float, default=30.0,
                   help="simulated model compute per step, as a model of realistic size "
                        "would take (default 30; 0: the tiny model alone, ~1 ms)")
    args = p.parse_args()

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    opt = optax.adam(1e-2)
    step_fn = make_step(opt)
    per_process = args.batch // data_slice(sharding)[1]  # the global batch over data slices
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
        step_s = args.step_ms / 1e3
        log_every = max(1, min(50, args.steps // 6))
        part1, part2 = Part(0, first), Part(first, second)
        if isinstance(args.workers, int):
            part1.workers = part2.workers = args.workers
        loader = ds.loader(options=options)
        loader.start_prefetch()  # overlaps opening the bucket with compiling the step
        it = loader.to_jax(sharding)
        print(f"training {part1.span} of {args.steps} from {url}")
        params, opt_state = train(it, params, opt_state, step_fn, part1, log_every, step_s)
        part1.took_stats(loader.stats())
        state = it.get_state()  # the batches handed out so far, not those prefetched
        save(ckpt_dir, (params, opt_state), state)
        it.close()  # "preempted"
        print(f"checkpointed at step {first} (model and optimizer: model.npz; loader: "
              f"{len(json.dumps(state))} bytes of JSON, {state['position']:,} records into "
              "the stream); restarting from it")

        # Part 2: a fresh loader and model, restored from the checkpoint. The loader first,
        # so its first batches are read while the model is restored (start_prefetch).
        loader = ds.loader(options=options, state=restore_loader_state(ckpt_dir))
        loader.start_prefetch()
        params, opt_state = restore_model(ckpt_dir, (params, opt_state), replicated)
        it = loader.to_jax(sharding)
        print(f"resumed at step {first + 1}")
        params, opt_state = train(it, params, opt_state, step_fn, part2, log_every, step_s)
        part2.took_stats(loader.stats())
        it.close()
        report([part1, part2], args.batch, args.step_ms, auto=args.workers == "auto")

if __name__ == "__main__":
    main()
