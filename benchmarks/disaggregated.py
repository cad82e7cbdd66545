"""`python -m benchmarks.disaggregated`: K CPU nodes of Ray actors feeding H accelerator hosts.

Why: with `executor="ray"` the decoding and transforms run on CPU nodes, and the training
host only receives finished batches. This model says how many CPU nodes an accelerator host
needs for a given transform cost, and where the bottleneck moves as K grows: the actors'
CPU, the training host's NIC (each batch crosses the network once, by value), the training
host's own loading CPU (the byte path and receiving results: the parent's CPU per record),
or the accelerators' demand. A sibling of `benchmarks.fleet` (which models the bucket);
deterministic, no randomness, a pure function of its arguments.

Per host, in steady state (records/s):

- demand: what the training step consumes (`--step-rate`, records/s per host);
- actors: K × `--node-cores` ÷ (`--actor-us` µs of actor CPU per record: decode, transforms,
  collate, serialisation) ÷ H (the K nodes serve all H hosts);
- NIC: `--nic-gbps` ÷ (`--out-bytes` per record as the batch arrives: what the transforms
  make, not what was read) -- plus, for remote files, the fetched bytes going out again to
  the actors (`--in-bytes`, which the byte path ships with each task: in and out of the host);
- host CPU: `--host-cores` given to loading ÷ `--host-us` µs of the parent's CPU per record.

delivered = min of the four; the bottleneck is the smallest. `--from-json` takes the actor
and parent CPU per record from a `bench_executors_ray.py --out` file (the median of its ray
rounds of one workload) instead of the flags.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

GBIT = 1e9 / 8  # bytes/s per Gbps


def measured(path: str, workload: str) -> tuple[float, float, float]:
    """(actor µs per record, parent µs per record in steady state, output bytes per record)
    from `bench_executors_ray.py --out`."""
    runs = json.loads(Path(path).read_text())[workload]["ray"]
    actor = statistics.median(
        sum(v for k, v in r["transfers"].items() if k.startswith("actor") and
            k.endswith("_ms")) * 1e3 / r["records"] for r in runs)
    host = statistics.median(r["steady_cpu_us"] for r in runs)
    out = {"text": 1100.0, "img": 128 * 128 * 4.0}.get(workload, 0.0)
    return actor, host, out


def rows(args: argparse.Namespace) -> list[dict]:
    out = []
    for k in args.nodes:
        caps = {
            "demand": args.step_rate,
            "actors": k * args.node_cores * 1e6 / args.actor_us / args.hosts,
            "NIC": args.nic_gbps * GBIT / (args.out_bytes + 2 * args.in_bytes),
            "host CPU": args.host_cores * 1e6 / args.host_us,
        }
        delivered = min(caps.values())
        binds = min(caps, key=caps.__getitem__)
        out.append({"K": k, **caps, "delivered": delivered, "binds": binds,
                    "busy": delivered / args.step_rate})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=8, help="accelerator hosts (H)")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--node-cores", type=float, default=32, help="actor cores per CPU node")
    p.add_argument("--actor-us", type=float, default=100.0,
                   help="actor CPU µs per record (decode + transforms + collate + send)")
    p.add_argument("--host-us", type=float, default=10.0,
                   help="the training host's loading CPU µs per record (the parent)")
    p.add_argument("--host-cores", type=float, default=2, help="host cores given to loading")
    p.add_argument("--out-bytes", type=float, default=64 * 1024,
                   help="bytes per record of the finished batch")
    p.add_argument("--in-bytes", type=float, default=0.0,
                   help="fetched bytes per record shipped to the actors (remote files)")
    p.add_argument("--nic-gbps", type=float, default=100.0, help="training host's NIC")
    p.add_argument("--step-rate", type=float, default=20_000,
                   help="records/s one host's training step consumes")
    p.add_argument("--from-json", default=None, help="bench_executors_ray.py --out file")
    p.add_argument("--workload", default="img", help="its workload (text or img)")
    args = p.parse_args()
    if args.from_json:
        args.actor_us, args.host_us, args.out_bytes = measured(args.from_json, args.workload)
    need = math.ceil(args.step_rate * args.hosts * args.actor_us / 1e6 / args.node_cores)
    print(f"H={args.hosts} hosts consuming {args.step_rate:,.0f} records/s each; actors "
          f"{args.actor_us:.0f} µs/record on {args.node_cores:g}-core nodes; host loading "
          f"{args.host_us:.1f} µs/record on {args.host_cores:g} cores; "
          f"{args.out_bytes / 1024:.0f} KiB out (+{args.in_bytes / 1024:.0f} KiB in) per "
          f"record over {args.nic_gbps:g} Gbps")
    print(f"CPU nodes for the actors to keep up: K >= {need} "
          f"({need / args.hosts:.2f} per accelerator host)")
    print("| K | actors | NIC | host CPU | delivered (k rec/s per host) | of demand | binds |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r in rows(args):
        print(f"| {r['K']} | {r['actors'] / 1e3:,.1f} | {r['NIC'] / 1e3:,.1f} | "
              f"{r['host CPU'] / 1e3:,.1f} | {r['delivered'] / 1e3:,.1f} | "
              f"{100 * r['busy']:.0f}% | {r['binds']} |")


if __name__ == "__main__":
    main()
