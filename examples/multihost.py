"""The training example on 2 local JAX processes (multi-host, on one machine).

    python examples/multihost.py [--processes 2] [--steps N]

The parent starts a local GCS emulator with the sample dataset and launches N processes.
Each calls `jax.distributed.initialize`, loads only its shard (`shard_by_jax_process()`),
and `to_jax(NamedSharding(mesh, P('data')))` assembles the global batch across processes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child(args: argparse.Namespace) -> None:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    import jax
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from train_from_bucket import init_params, make_step, pipeline

    from aioloader.jax import data_slice

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                               num_processes=args.processes, process_id=args.process_id)
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    me = jax.process_index()
    with jax.set_mesh(mesh):
        params = jax.device_put(init_params(jax.random.key(0)), NamedSharding(mesh, P()))
        opt = optax.adam(1e-2)
        opt_state, step = opt.init(params), make_step(opt)
        rows = NamedSharding(mesh, P("data"))
        # the per-process batch: the global batch over the data slices (here one a process)
        ds = pipeline(args.url, json.loads(args.storage_options),
                      args.batch // data_slice(rows)[1])
        it = ds.loader(workers=0).to_jax(rows)
        for k in range(args.steps):
            batch = next(it)
            params, opt_state, loss = step(params, opt_state, batch)
            if me == 0 and (k + 1) % 20 == 0:
                print(f"step {k + 1}: global batch {batch['label'].shape[0]} over "
                      f"{jax.device_count()} devices in {jax.process_count()} processes, "
                      f"loss {float(loss):.3f}", flush=True)
        state = it.get_state()
        it.close()
    multihost_utils.sync_global_devices("end")
    if me == 0:
        print("loader state (same on every process):", state["position"], "positions", flush=True)
    jax.distributed.shutdown()


def parent(args: argparse.Namespace) -> None:
    sys.path.insert(0, HERE)
    from train_from_bucket import dataset_url

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with dataset_url(None, args.records) as (url, opts):
        env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
               "JAX_PLATFORMS": "cpu"}
        procs = [subprocess.Popen([sys.executable, __file__, "--process-id", str(i),
                                   "--processes", str(args.processes), "--port", str(port),
                                   "--url", url, "--storage-options", json.dumps(opts),
                                   "--steps", str(args.steps), "--batch", str(args.batch)],
                                  env=env) for i in range(args.processes)]
        codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise SystemExit(f"a process failed: exit codes {codes}")
    print(f"{args.processes} processes trained {args.steps} steps in lockstep")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=128, help="global batch size")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--storage-options", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.process_id is None:
        parent(args)
    else:
        child(args)


if __name__ == "__main__":
    main()
