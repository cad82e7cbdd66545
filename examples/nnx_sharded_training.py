"""A Flax NNX transformer block trained on a ('data', 'model') mesh, checkpointed with Orbax
(model + optimizer + loader), interrupted, and resumed in a new process.

    python examples/nnx_sharded_training.py [--steps N] [--save-at K] [--batch B]

The setting of Google's "Scaling Up Deep Learning" talk on JAX + Flax NNX: parameters carry
sharding metadata (`nnx.with_partitioning`), the model is created sharded inside `nnx.jit`, batches
come from aioloader already placed on the mesh (`to_jax(NamedSharding(mesh, P('data')))`),
and one Orbax `CheckpointManager` saves the model, the optimizer and the loader's position
together (`ocp.args.Composite`). By default the mesh is 8 CPU devices of this host
(`XLA_FLAGS=--xla_force_host_platform_device_count=8`), 4 along 'data', 2 along 'model';
on an accelerator run it with `JAX_PLATFORMS=` (empty) and the mesh spans its devices.

The run trains `--steps` steps and checkpoints at step `--save-at`; then a *new process*
(`--resume`) restores that checkpoint, with the model built from abstract, sharded shapes, and
trains the remaining steps. It prints each step's loss and a digest of its batch, and checks
that the resumed process saw the same batches and computed the same losses, bit for bit.
"""

from __future__ import annotations

import os

# Before jax is imported: 8 CPU devices stand in for an accelerator slice.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import glob
import hashlib
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from common import SEQ, VOCAB, parse, to_fixed
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import aioloader as al
from aioloader.jax import LoaderRestore, LoaderSave

HERE = os.path.dirname(os.path.abspath(__file__))
DIM, HEADS, HIDDEN, CLASSES = 64, 4, 128, 4


class TransformerBlock(nnx.Module):
    """Embed -> pre-norm self-attention -> pre-norm MLP -> mean-pool -> classes.

    Every kernel says how it is split over the mesh: attention heads and the MLP's hidden
    units along 'model' (Megatron style), the rest replicated. The batch is split along 'data'.
    """

    def __init__(self, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.lecun_normal()
        self.embed = nnx.Embed(VOCAB, DIM, rngs=rngs, embedding_init=nnx.with_partitioning(
            nnx.initializers.normal(0.02), (None, "model")))
        self.norm1 = nnx.LayerNorm(DIM, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            HEADS, DIM, decode=False, rngs=rngs,
            kernel_init=nnx.with_partitioning(init, (None, "model", None)),
            out_kernel_init=nnx.with_partitioning(init, ("model", None, None)))
        self.norm2 = nnx.LayerNorm(DIM, rngs=rngs)
        self.up = nnx.Linear(DIM, HIDDEN, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, (None, "model")))
        self.down = nnx.Linear(HIDDEN, DIM, rngs=rngs,
                               kernel_init=nnx.with_partitioning(init, ("model", None)))
        self.head = nnx.Linear(DIM, CLASSES, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        mask = tokens > 0
        x = self.embed(tokens)
        x = x + self.attn(self.norm1(x), mask=nnx.make_attention_mask(mask, mask))
        x = x + self.down(jax.nn.gelu(self.up(self.norm2(x))))
        m = mask[..., None]
        return self.head((x * m).sum(1) / jnp.maximum(m.sum(1), 1))


def constrain(*objs: nnx.Object) -> None:
    """Pin every variable to its declared sharding (unannotated ones: replicated), inside jit.
    Without it XLA may choose another layout for outputs (a bias split along 'model'), and
    the next step, seeing new input shardings, would compile again."""
    state = nnx.state(objs)
    nnx.update(objs, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))


@nnx.jit(static_argnums=0)
def create_sharded(seed: int) -> tuple[TransformerBlock, nnx.Optimizer]:
    """Model and optimizer created inside jit with sharding constraints: each device only
    ever holds its own shard (no full copy on one device first)."""
    model = TransformerBlock(nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    constrain(model, optimizer)
    return model, optimizer


@nnx.jit
def train_step(model: TransformerBlock, optimizer: nnx.Optimizer, batch: dict) -> jax.Array:
    def loss_fn(model: TransformerBlock) -> jax.Array:
        logits = model(batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)  # gradients of sharded parameters come out sharded alike
    constrain(model, optimizer)
    return loss


def pipeline(paths: str, batch: int) -> al.Dataset:
    return (al.Dataset.from_arrayrecord(paths)
            .shuffle(seed=0).repeat().shard_by_jax_process()
            .map(parse).map(to_fixed).batch(batch, drop_remainder=True))


def digest(batch: dict) -> str:
    """A short fingerprint of a global batch (gathered from its shards)."""
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(np.asarray(batch[key]).tobytes())
    return h.hexdigest()[:12]


def abstract_state(mesh: jax.sharding.Mesh, seed: int) -> nnx.State:
    """Shapes, dtypes and shardings of (model, optimizer), without computing any value:
    what Orbax needs to restore each shard straight onto its device."""
    model, optimizer = nnx.eval_shape(lambda: create_sharded(seed))
    state = nnx.state((model, optimizer))
    shardings = nnx.get_named_sharding(state, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        state, shardings)


def run(args: argparse.Namespace, mesh: jax.sharding.Mesh) -> list[str]:
    """Train from step 0 (or from the checkpoint with --resume); return the step lines."""
    sharding = NamedSharding(mesh, P("data"))
    ds = pipeline(args.data, args.batch)
    loader = ds.loader(workers=args.workers, prefetch=2)
    lines: list[str] = []
    with ocp.CheckpointManager(args.ckpt_dir) as mngr, jax.set_mesh(mesh):
        if args.resume:
            start = mngr.latest_step()
            model, optimizer = nnx.eval_shape(lambda: create_sharded(args.seed))
            restored = mngr.restore(start, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state(mesh, args.seed)),
                data=LoaderRestore(loader)))
            nnx.update((model, optimizer), restored["state"])
            print(f"new process {os.getpid()}: restored step {start} from {args.ckpt_dir}")
        else:
            start = 0
            model, optimizer = create_sharded(args.seed)
        loader.start_prefetch()  # reading overlaps compiling the step
        it = loader.to_jax(sharding)
        kernel = model.up.kernel[...]
        print(f"mesh {dict(mesh.shape)}; MLP kernel {kernel.shape} in shards of "
              f"{kernel.addressable_shards[0].data.shape}; batch sharded as "
              f"{sharding.spec}")
        for step in range(start + 1, args.steps + 1):
            batch = next(it)
            loss = train_step(model, optimizer, batch)
            line = f"step {step:3d}  loss {float(loss):.7f}  batch {digest(batch)}"
            print(line, flush=True)
            lines.append(line)
            if step == args.save_at and not args.resume:
                mngr.save(step, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(nnx.state((model, optimizer))),
                    data=LoaderSave(it)))
                mngr.wait_until_finished()
                print(f"checkpointed model, optimizer and loader at step {step}")
        it.close()
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/sample/train-*.array_record")
    p.add_argument("--records", type=int, default=20_000, help="sample size, if written")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-at", type=int, default=20)
    p.add_argument("--batch", type=int, default=32, help="global batch size")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--model-axis", type=int, default=2, help="devices along 'model'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", help="(with --resume) the checkpoint to continue from")
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()

    n = jax.device_count()
    # Auto axes: XLA propagates the shardings and inserts the collectives (the talk's style).
    mesh = jax.make_mesh((n // args.model_axis, args.model_axis), ("data", "model"),
                         axis_types=(AxisType.Auto, AxisType.Auto))
    if not args.resume and not glob.glob(args.data):
        out = os.path.dirname(args.data) or "."
        subprocess.run([sys.executable, os.path.join(HERE, "write_sample.py"), out,
                        "--records", str(args.records)], check=True)
    if args.resume:
        run(args, mesh)
        return

    with tempfile.TemporaryDirectory() as tmp:
        args.ckpt_dir = args.ckpt_dir or tmp
        first = run(args, mesh)
        print(f"-- interrupted after step {args.save_at}; resuming in a new process --",
              flush=True)
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--resume", *sys.argv[1:],
             "--ckpt-dir", args.ckpt_dir], stdout=subprocess.PIPE, text=True, check=True)
        print(child.stdout, end="")
    resumed = [ln for ln in child.stdout.splitlines() if ln.startswith("step ")]
    expected = first[args.save_at:]
    if resumed != expected:
        sys.exit(f"MISMATCH after resume:\n  expected {expected}\n  got      {resumed}")
    print(f"resumed run matches: steps {args.save_at + 1}-{args.steps}, same batches and "
          f"losses, bit for bit (token batch {args.batch}x{SEQ} over {n} devices)")


if __name__ == "__main__":
    main()
