"""`python -m benchmarks.fleet`: N = 1…1,000 hosts reading one bucket, simulated second by second.

Why: the single-host benchmarks say how fast one process reads; a training fleet adds the
bucket's request-rate ramp, which no single host can see. This model runs each strategy's
request stream on N identical hosts (a synchronous job: all start together and the slowest
sets the pace, so one host stands for all) against one bucket, and reports time to steady
state, requests/s per host and in total, bytes read per useful byte and what binds.

Strategies:
- `exact`: exact global shuffle, one range GET per record (aioloader today when the dataset is
  larger than `resident_bytes`);
- `disk`: exact shuffle + disk tier (`cache_dir`): a background download fills the cache with
  sequential `segment`-sized GETs; a record is a local read with probability = cache coverage,
  else a GET. The fill and the per-record GETs share the client CPU and NIC (`--fill-share`
  each when both want more). Each host caches the whole dataset, up to `--disk` (a global
  shuffle touches every segment from every host);
- `block`: block shuffle: each host reads its share of `block`-sized runs (no overlap);
- `memory`: the dataset kept in memory (`resident_bytes`); only where it fits `--memory`. Each
  host loads all of it in segments; records flow as coverage grows (rate × coverage).

Bucket model (Google Cloud Storage, "Request rate and access distribution guidelines",
https://cloud.google.com/storage/docs/request-rate): a bucket starts with an IO capacity of
about 5,000 object reads/s (and ~1,000 writes/s: not used here); as the request rate
approaches capacity, GCS takes "on the order of minutes" to redistribute load, and clients
are told to double their request rate at most once per 20 minutes, else they see throttling
(429/503, higher latency). Modelled: capacity × 2 per `--doubling` seconds (1,200) while
demand exceeds it, never above `--bucket-max-reads`; requests over capacity are refused and
retried (demand persists), shared pro rata between hosts. A per-project egress bandwidth quota
exists (https://cloud.google.com/storage/docs/bandwidth-usage; raisable): `--bucket-gbps`
(0 = none). Per-host bandwidth: Compute Engine limits bandwidth per VM by machine type
(https://cloud.google.com/compute/docs/network-bandwidth: e.g. 16 Gbps for an n1-standard-8,
23 Gbps for a 22-vCPU C3, up to 100–200 Gbps with Tier_1): `--nic-gbps` (16). Latency: 30 ms
per request, as our emulator runs (BENCHMARKS.md: 20 ms + 15 ms jitter is close to real GCS).

Client costs are our measurements on 2 cores (issue 15, RESULTS.md): ~130–155 µs CPU per
range GET through `Storage.read` on libcurl (`--get-cpu-us`, 140), ~1 GB/s of large reads per
client core (`--client-gbps`), one event-loop core for I/O (`--io-cores`), 64–256 in flight
(`--in-flight`, 256), and the local pipeline rate (json.loads, batch 256, workers=2):
~114–136k rec/s of 1 KiB text (`--local-rate`, 125k) and ~2.1 GB/s of large records
(`--local-gbps`): a host serves min(local-rate, local-gbps ÷ record size) records/s. Scale
these for bigger hosts.

Reported per (dataset, record size, strategy, N), steady = the last simulated second:
time to steady (first second at ≥ 95% of the steady rate; "> horizon" if the bucket still
throttles at the end), records/s per host, GET/s per host and in total, bytes read per useful
byte over epoch 1 and over later epochs, epoch 1 time (extrapolated past the horizon), the
minutes the bucket throttled, and what binds at steady state. Deterministic; no randomness.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, fields

import numpy as np

STRATEGIES = ("exact", "disk", "block", "memory")
KIB, MIB, GB, TB = 1 << 10, 1 << 20, 10**9, 10**12


@dataclass(frozen=True)
class Params:
    """The model's knobs (defaults: the documented GCS figures and our 2-core measurements)."""

    bucket_reads: float = 5000.0  # initial object reads/s of a bucket
    bucket_max_reads: float = float("inf")
    doubling_s: float = 1200.0  # capacity doubles at most this often under pressure
    bucket_gbps: float = 0.0  # project egress quota, 0 = none
    nic_gbps: float = 16.0
    latency_s: float = 0.030
    in_flight: int = 256
    get_cpu_us: float = 140.0
    client_gbps: float = 8.0  # ~1 GB/s of large GETs per io core
    io_cores: float = 1.0
    local_rate: float = 125_000.0  # records/s the host's pipeline serves from local bytes
    local_gbps: float = 17.0  # ~2.1 GB/s of large records
    segment: int = 4 * MIB  # fill requests and blocks
    disk: float = 1.5 * TB
    memory: float = 256 * GB
    fill_share: float = 0.5
    seconds: int = 6 * 3600

    def local_records(self, record: np.ndarray) -> np.ndarray:
        return np.minimum(self.local_rate, self.local_gbps / 8 * GB / record)


@dataclass
class Cases:
    """One simulated scenario per element: a strategy, dataset bytes, record bytes, host count."""

    strategy: list[str]
    dataset: np.ndarray
    record: np.ndarray
    hosts: np.ndarray

    @classmethod
    def grid(cls, strategies, datasets, records, hosts) -> Cases:
        rows = [(s, d, r, n) for d in datasets for r in records for s in strategies
                for n in hosts]
        s, d, r, n = zip(*rows, strict=True)
        return cls(list(s), np.array(d, float), np.array(r, float), np.array(n, float))


@dataclass
class Run:
    """Per-case results of `simulate` (arrays of len(cases)); `rate` is (cases, seconds)."""

    rate: np.ndarray  # records/s per host, each second
    steady_rate: np.ndarray
    unthrottled_rate: np.ndarray  # the host's rate at the end had the bucket refused nothing
    steady_gets: np.ndarray  # GET/s per host at the end
    consumed: np.ndarray  # records per host over the horizon
    read_bytes: np.ndarray  # bytes per host over the horizon
    requests: np.ndarray  # GETs per host over the horizon
    epoch1_s: np.ndarray
    epoch1_bytes: np.ndarray  # bytes read per host by the end of epoch 1
    later_ratio: np.ndarray  # bytes read per useful byte once epoch 1 is over
    throttled_s: np.ndarray
    cap: np.ndarray  # bucket read capacity at the end
    max_cap: np.ndarray  # the most capacity ever reached
    bound: list[str]
    fits: np.ndarray  # False: the strategy can't run (memory: dataset > --memory)


def ramp_limit(p: Params, t: np.ndarray | float) -> np.ndarray | float:
    """The most read capacity the bucket can have after `t` seconds of pressure."""
    return np.minimum(p.bucket_reads * 2.0 ** (np.asarray(t) / p.doubling_s), p.bucket_max_reads)


def bucket_step(cap: np.ndarray, demand: np.ndarray, p: Params) -> tuple[np.ndarray, np.ndarray]:
    """One second of the bucket: the fraction of demanded requests served, and next capacity.

    Capacity grows by 2^(1/doubling) a second while demand exceeds it, up to the max."""
    frac = np.where(demand > cap, cap / np.maximum(demand, 1e-300), 1.0)
    grown = np.minimum(cap * 2.0 ** (1.0 / p.doubling_s), p.bucket_max_reads)
    return frac, np.where(demand > cap, np.maximum(grown, cap), cap)


@dataclass(frozen=True)
class Host:
    """Per-case constants of one host (arrays over cases)."""

    strat: np.ndarray
    D: np.ndarray
    R: np.ndarray
    N: np.ndarray
    local: np.ndarray  # records/s the pipeline serves from local bytes
    target: np.ndarray  # bytes to fill (disk tier: min(D, disk); memory: D)
    fits: np.ndarray
    use_r: np.ndarray  # share of a host's second (CPU or NIC, the larger) per record GET
    use_b: float  # the same per segment GET
    inflight: float  # small GETs/s the in-flight window allows

    @classmethod
    def of(cls, cases: Cases, p: Params) -> Host:
        strat = np.array(cases.strategy)
        D, R = cases.dataset, cases.record
        fits = (strat != "memory") | (p.memory >= D)
        target = np.where(strat == "disk", np.minimum(D, p.disk),
                          np.where((strat == "memory") & fits, D, 0.0))
        nic = p.nic_gbps / 8 * GB
        per_core = p.client_gbps / 8 * GB  # bytes/s of large GETs one client core moves

        def use(size):
            return np.maximum(size / nic, (p.get_cpu_us * 1e-6 + size / per_core) / p.io_cores)

        return cls(strat, D, R, cases.hosts, p.local_records(R), target, fits, use(R),
                   float(use(float(p.segment))), p.in_flight / p.latency_s)


def host_step(h: Host, filled: np.ndarray, p: Params
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What each host asks of the bucket in one second: (record GETs, fill GETs, block GETs).

    The disk tier's fill and its record GETs each get `fill_share` / the rest of the host's
    CPU and NIC while both want more; a share one leaves unused goes to the other."""
    is_disk = h.strat == "disk"
    cov = filled / h.D
    filling = filled < h.target
    miss_need = np.where(h.strat == "exact", h.local, np.where(is_disk, h.local * (1 - cov), 0))
    share = np.where(is_disk & filling, 1 - p.fill_share, 1.0)
    miss = np.minimum(miss_need, np.minimum(share / h.use_r, h.inflight))
    left = np.clip(1 - miss * h.use_r, 0.0, 1.0)
    fill = np.where(filling, np.minimum(left / h.use_b, (h.target - filled) / p.segment), 0.0)
    blocks = np.where(h.strat == "block", np.minimum(h.local * h.R / p.segment, 1 / h.use_b), 0)
    return miss, fill, blocks


def records_served(h: Host, filled: np.ndarray, miss: np.ndarray, blocks: np.ndarray,
                   p: Params) -> np.ndarray:
    """Records/s per host from what the bucket served (and the local copy)."""
    cov = filled / h.D
    disk = np.where(cov < 1, np.minimum(h.local, miss / np.maximum(1 - cov, 1e-12)), h.local)
    r = np.select([h.strat == "exact", h.strat == "disk", h.strat == "block"],
                  [miss, disk, blocks * p.segment / h.R], h.local * cov)
    return np.where(h.fits, r, 0.0)


def simulate(cases: Cases, p: Params) -> Run:
    """Run every case for `p.seconds` one-second steps (vectorised over cases)."""
    h = Host.of(cases, p)
    epoch = h.D / h.R / h.N  # records per host per epoch
    T, C = int(p.seconds), len(h.R)
    cap = np.full(C, p.bucket_reads)
    max_cap, filled, consumed, read, reqs, throttled = cap.copy(), *np.zeros((5, C))
    epoch1_s, epoch1_bytes = np.full(C, np.nan), np.full(C, np.nan)
    rate = np.zeros((C, T))
    for t in range(T):
        miss, fill, blocks = host_step(h, filled, p)
        demand = h.N * (miss + fill + blocks)
        f, cap_next = bucket_step(cap, demand, p)
        if p.bucket_gbps > 0:
            want = h.N * (miss * h.R + (fill + blocks) * p.segment)
            f = np.minimum(f, np.minimum(1.0, p.bucket_gbps / 8 * GB / np.maximum(want, 1e-300)))
        miss, fill, blocks = miss * f, fill * f, blocks * f
        r = records_served(h, filled, miss, blocks, p)
        filled = np.minimum(filled + fill * p.segment, h.target)
        # Kept in memory: a host can't have served more records than have arrived.
        loading = (h.strat == "memory") & (filled < h.target)
        r = np.where(loading, np.minimum(r, np.maximum(filled / h.R - consumed, 0)), r)
        consumed += r
        read += miss * h.R + (fill + blocks) * p.segment
        reqs += miss + fill + blocks
        throttled += (f < 0.99) & (demand > 0)
        done = np.isnan(epoch1_s) & (consumed >= epoch)
        epoch1_s[done], epoch1_bytes[done] = t + 1, read[done]
        rate[:, t] = r
        cap = cap_next
        max_cap = np.maximum(max_cap, cap)

    steady = rate[:, -1]
    miss, fill, blocks = host_step(h, filled, p)  # the end state, had the bucket refused none
    unthrottled = records_served(h, filled, miss, blocks, p)
    cov = filled / h.D
    is_disk = h.strat == "disk"
    gets = np.select([h.strat == "exact", is_disk, h.strat == "block"],
                     [steady, steady * (1 - cov), steady * h.R / p.segment], 0.0)
    gets = gets + np.where(fill > 0, fill * np.minimum(1.0, steady / np.maximum(
        unthrottled, 1e-12)), 0.0)
    later = np.select([is_disk, h.strat == "memory"], [1 - cov, 0.0], 1.0)
    todo = np.isnan(epoch1_s) & h.fits
    rem = np.maximum(epoch - consumed, 0.0)
    epoch1_s = np.where(todo, T + rem / np.maximum(steady, 1e-12), epoch1_s)
    epoch1_bytes = np.where(todo, read + rem * h.R * later, epoch1_bytes)
    bound = [_bound(i, h, p, steady, unthrottled, filled) for i in range(C)]
    return Run(rate, steady, unthrottled, gets, consumed, read, reqs, epoch1_s, epoch1_bytes,
               later, throttled, cap, max_cap, bound, h.fits)


def _bound(i: int, h: Host, p: Params, steady, unthrottled, filled) -> str:
    """What limits case `i` at the end: the bucket, decoding, the fill, or the client."""
    if not h.fits[i]:
        return "doesn't fit"
    if steady[i] < 0.99 * unthrottled[i]:
        return "bucket ramp" if p.bucket_gbps <= 0 else "bucket"
    if steady[i] >= 0.99 * h.local[i]:
        return "decode"
    if filled[i] < h.target[i]:
        return "filling"
    nic = p.nic_gbps / 8 * GB
    size, use = (p.segment, h.use_b) if h.strat[i] == "block" else (h.R[i], h.use_r[i])
    if h.strat[i] != "block" and 1 / use > h.inflight:
        return "in-flight"
    return "NIC" if size / nic >= use - 1e-12 else "client CPU"


# -- output -------------------------------------------------------------------------------


def _num(x: float) -> str:
    if not np.isfinite(x):
        return "—"
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _dur(s: float) -> str:
    if not np.isfinite(s):
        return "—"
    for div, unit in ((86400 * 365, "y"), (86400, "d"), (3600, "h"), (60, "min")):
        if s >= div:
            return f"{s / div:.3g} {unit}"
    return f"{s:.0f} s"


def _bytes(x: float) -> str:
    for div, unit in ((TB, "TB"), (GB, "GB"), (MIB, "MiB"), (KIB, "KiB")):
        if x >= div:
            return f"{x / div:g} {unit}"
    return f"{x:g} B"


def time_to_steady(run: Run, p: Params) -> np.ndarray:
    """First second at ≥ 95% of the steady rate; inf when the end is still throttled."""
    ok = run.rate >= 0.95 * run.steady_rate[:, None]
    first = np.argmax(ok, axis=1).astype(float) + 1
    late = run.steady_rate < 0.95 * run.unthrottled_rate
    return np.where(late | ~run.fits | (run.steady_rate <= 0), np.inf, first)


def table(cases: Cases, run: Run, p: Params) -> str:
    """Markdown: one table per (dataset, record size)."""
    tts = time_to_steady(run, p)
    useful = cases.record * cases.dataset / cases.record / cases.hosts  # bytes per host/epoch
    e1 = run.epoch1_bytes / useful
    out = []
    key = None
    for i in range(len(cases.record)):
        k = (cases.dataset[i], cases.record[i])
        if k != key:
            key = k
            out += ["", f"#### dataset {_bytes(k[0])}, records of {_bytes(k[1])} "
                        f"({_num(k[0] / k[1])} records)", "",
                    "| strategy | hosts | time to steady | rec/s per host | GET/s per host "
                    "| GET/s total | bytes read ÷ useful, epoch 1 / later | epoch 1 "
                    "| bucket throttled | bound by |",
                    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        if not run.fits[i]:
            out.append(f"| {cases.strategy[i]} | {cases.hosts[i]:.0f} | n/a | — | — | — | — "
                       f"| — | — | doesn't fit {_bytes(p.memory)} |")
            continue
        steady = "> horizon" if not np.isfinite(tts[i]) else _dur(tts[i])
        out.append(
            f"| {cases.strategy[i]} | {cases.hosts[i]:.0f} | {steady} "
            f"| {_num(run.steady_rate[i])} | {_num(run.steady_gets[i])} "
            f"| {_num(run.steady_gets[i] * cases.hosts[i])} "
            f"| {e1[i]:.3g} / {run.later_ratio[i]:.3g} | {_dur(run.epoch1_s[i])} "
            f"| {_dur(run.throttled_s[i])} | {run.bound[i]} |")
    return "\n".join(out[1:])


_UNITS = {"": 1, "b": 1, "k": KIB, "kib": KIB, "kb": 10**3, "m": MIB, "mib": MIB, "mb": 10**6,
          "g": GB, "gb": GB, "gib": 1 << 30, "t": TB, "tb": TB, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'100GB' → 10**11, '1KiB' → 1024, '4MiB' → 4194304 (SI for GB/TB, binary for KiB/MiB)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100GB, 1KiB, 4MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=doc.split("\n\n")[0].split(": ", 1)[1] + "\n\n" + doc.split("\n\n", 1)[1])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        metavar="S", help=f"any of {', '.join(STRATEGIES)} (default: all)")
    parser.add_argument("--datasets", nargs="+", type=parse_size,
                        default=[100 * GB, 10 * TB, 100 * TB], metavar="SIZE",
                        help="dataset sizes (default 100GB 10TB 100TB)")
    parser.add_argument("--records", nargs="+", type=parse_size, default=[KIB, 100 * KIB],
                        metavar="SIZE", help="record sizes (default 1KiB 100KiB)")
    parser.add_argument("--hosts", nargs="+", type=int, default=[1, 8, 64, 256, 1000],
                        metavar="N", help="host counts (default 1 8 64 256 1000)")
    model = parser.add_argument_group("model (defaults: documented GCS figures, measured "
                                      "client costs)")
    helps = {"bucket_reads": "initial bucket object reads/s", "bucket_max_reads":
             "bucket read capacity ceiling", "doubling_s": "seconds per capacity doubling "
             "under pressure", "bucket_gbps": "project egress quota in Gbps (0: none)",
             "nic_gbps": "per-host NIC, Gbps", "latency_s": "seconds per request",
             "in_flight": "GETs in flight per host", "get_cpu_us": "client CPU µs per GET",
             "client_gbps": "Gbps of large GETs one client core moves", "io_cores":
             "cores doing I/O per host", "local_rate": "records/s the pipeline serves from "
             "local bytes", "local_gbps": "Gbps the pipeline serves from local bytes",
             "segment": "bytes per fill / block request", "disk": "disk-tier cache_bytes per "
             "host", "memory": "memory per host for the kept-in-memory dataset",
             "fill_share": "share of CPU/NIC the disk-tier fill gets when contended",
             "seconds": "simulated seconds (the horizon)"}
    for f in fields(Params):
        sized = f.name in ("segment", "disk", "memory")
        kind = parse_size if sized else type(f.default)
        flag = "--seconds" if f.name == "seconds" else "--" + f.name.removesuffix(
            "_s").replace("_", "-")
        shown = _bytes(f.default) if sized else f"{f.default:g}"
        model.add_argument(flag, dest=f.name, type=kind, default=f.default, metavar="X",
                           help=f"{helps[f.name]} (default {shown})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    p = Params(**{f.name: getattr(args, f.name) for f in fields(Params)})
    cases = Cases.grid(args.strategies, args.datasets, args.records, args.hosts)
    run = simulate(cases, p)
    print(f"Fleet model, {p.seconds / 3600:g} h simulated in 1 s steps; bucket starts at "
          f"{p.bucket_reads:g} reads/s, ×2 per {p.doubling_s / 60:g} min under pressure; "
          f"{p.nic_gbps:g} Gbps NIC, {p.latency_s * 1e3:g} ms, {p.in_flight} in flight, "
          f"{p.get_cpu_us:g} µs CPU/GET, local {_num(p.local_rate)} rec/s.\n")
    print(table(cases, run, p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
