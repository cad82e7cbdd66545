"""`to_jax` on an accelerator: does a training loop fed by aioloader ever wait for data?

Standalone (not part of `python -m benchmarks run`, which compares with peers on CPU). It writes
its own ArrayRecord files to a temporary folder with aioloader's writer, then for each workload

- text:  1 KiB JSON records -> `json.loads` -> 128 int32 tokens, batch 256 (128 KiB batches);
- image: 64 KiB noisy uint8 records -> zero-copy (128, 128, 4) view, batch 256 (16 MiB batches),

over `shuffle(seed).repeat().map(fn).batch(256, drop_remainder=True)`, it measures:

- ceiling: `jax.device_put` of pre-made numpy batches of the same shape, each waited for
  (one in flight), and with two in flight: what host->device copies alone allow;
- step alone: the simulated training step (a jitted chain of bf16 4096x4096 matrix products
  seeded by the batch, calibrated to --step-ms, `block_until_ready` every step) on a batch
  already on the device: what the accelerator allows;
- ideal feeder: the step fed by `device_put` of pre-made numpy batches, two ahead (what a
  loader that costs nothing would give);
- for each workers x prefetch_to_device: time to first batch (from `ds.loader()` to the first
  batch on the device), the feed rate (`to_jax` with no step, each batch waited for), and the
  training loop over `to_jax` (% of wall time spent in `next()`, steps/s against the step
  alone, host cores busy).

Every step also checks the rows it got on the device (text: each row's token pattern; image:
each row's byte sum against a table by record id, the id being the record's first 4 bytes),
so a batch torn by a reused shared-memory slot would count as corrupted.

Run from the repository root, with jax installed (any backend; on CPU it runs, but says
nothing about accelerators):

    python benchmarks/bench_to_jax.py --out /tmp/to_jax
    python benchmarks/bench_to_jax.py --quick          # a smoke test (CPU-friendly)

It prints a markdown table and writes results.json and results.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 256
SEQ = 128  # tokens per text record
VOCAB = 50257
STRIDE = 7919  # token j of record i is (i * 131 + j * STRIDE) % VOCAB
TEXT_BYTES = 1024
IMAGE_SHAPE = (128, 128, 4)  # 64 KiB


# -- the transforms (module level: worker processes import them by name) --------------------


def tokens(record: bytes) -> np.ndarray:
    """The text decode: `json.loads` of a 1 KiB record, its token list as int32."""
    return np.asarray(json.loads(record)["tokens"], dtype=np.int32)


def image(record: bytes) -> np.ndarray:
    """The image decode: a zero-copy (128, 128, 4) uint8 view of the record."""
    return np.frombuffer(record, dtype=np.uint8).reshape(IMAGE_SHAPE)


# -- data -------------------------------------------------------------------------------------


def text_record(i: int) -> bytes:
    toks = [(i * 131 + j * STRIDE) % VOCAB for j in range(SEQ)]
    body = json.dumps({"id": i, "tokens": toks, "pad": ""}, separators=(",", ":"))
    pad = TEXT_BYTES - len(body)
    if pad < 0:
        raise AssertionError(f"text record {i} is {len(body)} bytes, over {TEXT_BYTES}")
    return body.replace('"pad":""', '"pad":"' + " " * pad + '"').encode()


def write_data(root: Path, n_text: int, n_image: int, shards: int, compression: str,
               ) -> tuple[dict[str, list[str]], np.ndarray]:
    """Write both datasets; return their paths and the image byte sums by record id."""
    from aioloader import ArrayRecordWriter

    rng = np.random.default_rng(0)
    paths: dict[str, list[str]] = {"text": [], "image": []}
    sums = np.zeros(n_image, dtype=np.int64)
    for kind, n in (("text", n_text), ("image", n_image)):
        per = -(-n // shards)
        for s in range(shards):
            path = root / f"{kind}-{s:05d}-of-{shards:05d}.array_record"
            with ArrayRecordWriter(path, group_size=1, compression=compression) as w:
                for i in range(s * per, min(n, (s + 1) * per)):
                    if kind == "text":
                        w.write(text_record(i))
                    else:
                        img = rng.integers(0, 256, size=int(np.prod(IMAGE_SHAPE)), dtype=np.uint8)
                        img[:4] = np.frombuffer(np.uint32(i).tobytes(), np.uint8)
                        sums[i] = int(img.sum(dtype=np.int64))
                        w.write(img.tobytes())
            paths[kind].append(str(path))
    return paths, sums


def dataset(paths: list[str], kind: str) -> Any:
    import aioloader as al

    fn = tokens if kind == "text" else image
    return (al.Dataset.from_arrayrecord(paths).shuffle(seed=1).repeat()
            .map(fn).batch(BATCH, drop_remainder=True))


# -- the simulated step -----------------------------------------------------------------------


def make_step(kind: str, sums: np.ndarray) -> Any:
    """`step(w, batch, n)`: n bf16 matrix products seeded by the batch, plus a count of rows
    that are not what the writer wrote (n is static: one compilation per n)."""
    import jax
    import jax.numpy as jnp

    table = jnp.asarray(sums.astype(np.int32))

    def corrupted(batch: Any) -> Any:
        if kind == "text":
            j = jnp.arange(SEQ, dtype=jnp.int32)
            want = (batch[:, :1] + j * STRIDE) % VOCAB
            return jnp.sum(jnp.any(batch != want, axis=1))
        b = batch.reshape(batch.shape[0], -1)
        head = b[:, :4].astype(jnp.uint32)
        ids = head[:, 0] | head[:, 1] << 8 | head[:, 2] << 16 | head[:, 3] << 24
        ids = jnp.minimum(ids, table.shape[0] - 1).astype(jnp.int32)
        return jnp.sum(jnp.sum(b.astype(jnp.int32), axis=1) != table[ids])

    def step(w: Any, batch: Any, n: int) -> Any:
        seed = jnp.mean(batch.astype(jnp.float32)) / 256.0
        h = (w * seed).astype(jnp.bfloat16)
        h = jax.lax.fori_loop(0, n, lambda _, h: jnp.tanh(h @ w), h)
        return jnp.mean(h.astype(jnp.float32)), corrupted(batch)

    return jax.jit(step, static_argnums=2)


def calibrate(step: Any, w: Any, batch: Any, target_ms: float) -> tuple[int, float]:
    """The product count n that makes one step take about target_ms; and that step's ms."""
    import jax

    def ms(n: int) -> float:
        jax.block_until_ready(step(w, batch, n))  # compile
        times = []
        for _ in range(10):
            t = time.perf_counter()
            jax.block_until_ready(step(w, batch, n))
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    jax.block_until_ready(step(w, batch, 9))
    t = time.perf_counter()
    while time.perf_counter() - t < 1.0:  # let the clocks rise before timing
        jax.block_until_ready(step(w, batch, 9))
    lo, hi = ms(1), ms(9)
    per = max((hi - lo) / 8, 1e-3)
    n = max(1, round(1 + (target_ms - lo) / per))
    return n, ms(n)


# -- measurements -----------------------------------------------------------------------------


def cpu_seconds() -> float:
    """User + system CPU of this process and its descendants (the workers), if psutil is there."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def ceiling(host: list[np.ndarray], sharding: Any, n: int, in_flight: int,
            ) -> tuple[float, float]:
    """Batches/s of `device_put` of pre-made numpy batches, `in_flight` copies outstanding;
    and the median time the `device_put` call itself holds the calling thread (ms)."""
    import jax

    pending: deque = deque()
    for i in range(min(10, n)):  # warm-up
        jax.block_until_ready(jax.device_put(host[i % len(host)], sharding))
    calls = []
    t = time.perf_counter()
    for i in range(n):
        tc = time.perf_counter()
        pending.append(jax.device_put(host[i % len(host)], sharding))
        calls.append(time.perf_counter() - tc)
        if len(pending) >= in_flight:
            pending.popleft().block_until_ready()
    while pending:
        pending.popleft().block_until_ready()
    return n / (time.perf_counter() - t), 1e3 * statistics.median(calls)


def host_feed(ds: Any, workers: int, prefetch: int | None, warmup: int, n: int,
              executor: str = "processes") -> tuple[float, float]:
    """Batches/s of the loader alone (numpy batches, nothing sent to the device); cores busy."""
    with ds.loader(workers=workers, prefetch=prefetch, executor=executor) as ld:
        it = iter(ld)
        for _ in range(warmup + 1):
            next(it)
        cpu0, t = cpu_seconds(), time.perf_counter()
        for _ in range(n):
            next(it)
        wall = time.perf_counter() - t
        return n / wall, (cpu_seconds() - cpu0) / wall


def step_alone(step: Any, w: Any, batch: Any, k: int, n: int) -> float:
    import jax

    for _ in range(5):
        jax.block_until_ready(step(w, batch, k))
    t = time.perf_counter()
    for _ in range(n):
        jax.block_until_ready(step(w, batch, k))
    return n / (time.perf_counter() - t)


def ideal_feeder(step: Any, w: Any, host: list[np.ndarray], sharding: Any, k: int, n: int,
                 ) -> float:
    """Steps/s of the step fed by `device_put` of pre-made batches, two ahead."""
    import jax

    def run(count: int) -> float:
        ready = deque(jax.device_put(host[i % len(host)], sharding) for i in range(2))
        t = time.perf_counter()
        for i in range(count):
            batch = ready.popleft()
            ready.append(jax.device_put(host[(i + 2) % len(host)], sharding))
            jax.block_until_ready(step(w, batch, k))
        return count / (time.perf_counter() - t)

    run(5)
    return run(n)


class _PutTimer:
    """Wraps `aioloader.jax.put_batch` (what `to_jax` calls to place a batch: inside `next()`
    before the placement thread, on that thread since) to time it."""

    def __enter__(self) -> _PutTimer:
        import aioloader.jax as aj

        self.module, self.inner, self.seconds = aj, aj.put_batch, 0.0

        def put_batch(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return self.inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        aj.put_batch = put_batch
        return self

    def __exit__(self, *exc: Any) -> None:
        self.module.put_batch = self.inner


def loader_run(ds: Any, sharding: Any, step: Any, w: Any, k: int, workers: int,
               prefetch: int | None, depth: int, warmup: int, n: int,
               executor: str = "processes") -> dict[str, Any]:
    """One loader: time to first batch, warm-up, the training loop, then the feed rate."""
    import jax

    t0 = time.perf_counter()
    ld = ds.loader(workers=workers, prefetch=prefetch, executor=executor)
    used = ld.prefetch  # the loader's default when prefetch is None
    it = ld.to_jax(sharding, prefetch_to_device=depth)
    try:
        first = next(it)
        jax.block_until_ready(first)
        ttfb = time.perf_counter() - t0
        bad = step(w, first, k)[1]
        for _ in range(warmup):
            batch = next(it)
            loss, b = step(w, batch, k)
            jax.block_until_ready(loss)
            bad = bad + b
        # the training loop: time in next() is time the accelerator waits for data
        waits = []
        cpu0, t = cpu_seconds(), time.perf_counter()
        with _PutTimer() as put:
            for _ in range(n):
                tw = time.perf_counter()
                batch = next(it)
                waits.append(time.perf_counter() - tw)
                loss, b = step(w, batch, k)
                jax.block_until_ready(loss)
                bad = bad + b
        loop_s, loop_cpu = time.perf_counter() - t, cpu_seconds() - cpu0
        # the feed rate: to_jax alone, each batch waited for on the device
        cpu0, t = cpu_seconds(), time.perf_counter()
        for _ in range(n):
            jax.block_until_ready(next(it))
        feed_s = time.perf_counter() - t
        feed_cpu = cpu_seconds() - cpu0
        bad = int(bad)
    finally:
        it.close()
    wait_s = sum(waits)
    waits.sort()
    return {
        "workers": workers, "prefetch": "default" if prefetch is None else prefetch,
        "prefetch_used": used, "prefetch_to_device": depth, "ttfb_s": ttfb,
        "loop_next_ms_mean": 1e3 * wait_s / n, "loop_put_ms_mean": 1e3 * put.seconds / n,
        "loop_steps_per_s": n / loop_s, "loop_wait_pct": 100 * wait_s / loop_s,
        "loop_wait_ms_median": 1e3 * waits[len(waits) // 2],
        "loop_wait_ms_max": 1e3 * waits[-1],
        "loop_cores_busy": loop_cpu / loop_s,
        "feed_batches_per_s": n / feed_s, "feed_cores_busy": feed_cpu / feed_s,
        "corrupted_rows": bad,
    }


# -- driver -----------------------------------------------------------------------------------


def fmt(x: float, digits: int = 3) -> str:
    if x != x:  # nan
        return "—"
    return f"{x:.{digits}g}" if abs(x) < 10 ** digits else f"{x:,.0f}"


def spread(xs: list[float], scale: float = 1.0, digits: int = 3) -> str:
    """`median [min–max]` of xs times scale (just the value when there is one)."""
    xs = sorted(x * scale for x in xs)
    if len(xs) == 1:
        return fmt(xs[0], digits)
    return f"{fmt(statistics.median(xs), digits)} [{fmt(xs[0], digits)}–{fmt(xs[-1], digits)}]"


def table(res: dict[str, Any]) -> str:
    lines = []
    for kind, r in res["workloads"].items():
        mb = r["batch_bytes"] / 1e6
        b = r["baselines"]
        alone = statistics.median(b["step_alone_steps_per_s"])
        ceil = statistics.median(b["ceiling_2_in_flight_batches_per_s"])
        ideal = [x / y for x, y in zip(b["ideal_feeder_steps_per_s"], b["step_alone_steps_per_s"])]
        lines += [
            f"**{kind}**: batch {tuple(r['batch_shape'])} {r['dtype']} ({mb:.3g} MB); step "
            f"{r['step_ms']:.2f} ms ({r['step_products']} bf16 {res['dim']}² products).  ",
            "Baselines: `jax.device_put` of pre-made numpy batches "
            f"{spread(b['ceiling_serial_batches_per_s'], mb)} MB/s one in flight, "
            f"**{spread(b['ceiling_2_in_flight_batches_per_s'], mb)} MB/s** two in flight "
            f"(the ceiling below; the call itself holds the thread "
            f"{spread(b['device_put_call_ms'])} ms); the step alone "
            f"**{spread(b['step_alone_steps_per_s'])} steps/s**; the step fed by `device_put` "
            f"of pre-made batches two ahead {spread(b['ideal_feeder_steps_per_s'])} steps/s "
            f"= **{spread(ideal)}×** the step alone.",
            "",
            "| workers | loader prefetch | prefetch_to_device | time to first batch (s) | "
            "loader alone, host: batches/s | to_jax feed: batches/s | to_jax feed: MB/s | "
            "to_jax feed: rec/s | feed ÷ device_put ceiling | loop ÷ step alone | "
            "loop: % wall in next() | next() mean (ms) | device_put per batch, any thread (ms) | "
            "cores busy, loop / feed | corrupted rows |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in r["configs"]:
            runs = c["runs"]

            def col(key: str, runs: list = runs) -> list[float]:
                return [x[key] for x in runs]

            feed = col("feed_batches_per_s")
            host = r["host_feed"][f"{c['workers']},{c['prefetch']}"]
            used = sorted({x.get("prefetch_used", c["prefetch"]) for x in runs})
            shown = c["prefetch"] if c["prefetch"] != "default" else \
                f"default ({', '.join(map(str, used))})"
            busy = (f"{fmt(statistics.median(col('loop_cores_busy')), 2)} / "
                    f"{fmt(statistics.median(col('feed_cores_busy')), 2)}")
            lines.append(
                f"| {c['workers']} | {shown} | {c['prefetch_to_device']} | "
                f"{spread(col('ttfb_s'))} | "
                f"{spread(host['batches_per_s'])} | {spread(feed)} | {spread(feed, mb)} | "
                f"{spread(feed, BATCH)} | {spread(feed, 1 / ceil)} | "
                f"{spread([x / alone for x in col('loop_steps_per_s')])} | "
                f"{spread(col('loop_wait_pct'))} | {spread(col('loop_next_ms_mean'))} | "
                f"{spread(col('loop_put_ms_mean'))} | "
                f"{busy} | {sum(col('corrupted_rows'))} |")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_to_jax",
        description="A training loop over ds.loader(workers=W).to_jax(sharding) on the first "
        "JAX backend (GPU/TPU when there is one): feed rate against device_put of pre-made "
        "batches, % of wall time waiting in next(), time to first batch. Writes its own "
        "ArrayRecord data to a temporary folder. Each figure is median [min-max] over "
        "--repeats; within a repeat every configuration runs once, in turn.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workloads", default="text,image", help="comma-separated: text, image")
    p.add_argument("--workers", default="0,2,4,8", help="comma-separated worker counts")
    p.add_argument("--executor", default="processes", choices=("processes", "threads"),
                   help="where the workers run (ds.loader(executor=...))")
    p.add_argument("--loader-prefetch", default="default",
                   help="comma-separated ds.loader(prefetch=...) values (tasks in flight); "
                   "'default': not given (the loader's default for the worker count)")
    p.add_argument("--prefetch-to-device", default="1,2",
                   help="comma-separated to_jax(prefetch_to_device=...) values")
    p.add_argument("--batches", type=int, default=200,
                   help="timed batches per loop (after the warm-up)")
    p.add_argument("--warmup", type=int, default=20, help="untimed batches after the first")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=8.0,
                   help="the simulated training step's target time on the device")
    p.add_argument("--dim", type=int, default=4096,
                   help="side of the step's bf16 matrix products")
    p.add_argument("--text-records", type=int, default=20_000)
    p.add_argument("--image-records", type=int, default=4096,
                   help="64 KiB each; the dataset repeats, so this only bounds its size")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--compression", default="zstd:3", help="as ArrayRecordWriter takes it")
    p.add_argument("--out", default=None, help="folder for results.json and results.md")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: 20 batches, 2 warm-up, 1 repeat, workers 0,1, a 2 ms "
                   "step of 256² products, small datasets")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.warmup, args.repeats, args.workers = 20, 2, 1, "0,1"
        args.step_ms, args.dim = 2.0, 256
        args.text_records, args.image_records, args.shards = 2048, 512, 2
    return args


def setup(kind: str, ds: Any, sums: np.ndarray, w: Any, sharding: Any, step_ms: float,
          ) -> dict[str, Any]:
    """Pre-made batches (the first 8 the loader gives), the step, its calibration."""
    import jax

    with ds.loader(workers=0) as ld:
        it = iter(ld)
        host = [np.array(next(it)) for _ in range(8)]
    step = make_step(kind, sums)
    on_dev = jax.device_put(host[0], sharding)
    k, ms = calibrate(step, w, on_dev, step_ms)
    print(f"{kind}: step {ms:.2f} ms ({k} products)", flush=True)
    return {"ds": ds, "host": host, "step": step, "on_dev": on_dev, "k": k,
            "record": {"batch_shape": list(host[0].shape), "dtype": str(host[0].dtype),
                       "batch_bytes": host[0].nbytes, "step_products": k, "step_ms": ms,
                       "baselines": {}, "host_feed": {}, "configs": []}}


def _rounded(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) else x


def one_repeat(s: dict[str, Any], w: Any, sharding: Any, args: argparse.Namespace) -> None:
    """Every measurement of one workload once, appended to s["record"]."""
    r, n = s["record"], args.batches
    step, k, host = s["step"], s["k"], s["host"]
    base = {}
    base["ceiling_serial_batches_per_s"], _ = ceiling(host, sharding, n, 1)
    base["ceiling_2_in_flight_batches_per_s"], base["device_put_call_ms"] = ceiling(
        host, sharding, n, 2)
    base["step_alone_steps_per_s"] = step_alone(step, w, s["on_dev"], k, n)
    base["ideal_feeder_steps_per_s"] = ideal_feeder(step, w, host, sharding, k, n)
    for key, v in base.items():
        r["baselines"].setdefault(key, []).append(v)
    print(f"  baselines: {json.dumps({a: round(b, 3) for a, b in base.items()})}", flush=True)
    for workers, prefetch in ((int(x), None if p == "default" else int(p))
                              for x in args.workers.split(",")
                              for p in args.loader_prefetch.split(",")):
        rate, busy = host_feed(s["ds"], workers, prefetch, args.warmup, n, args.executor)
        name = "default" if prefetch is None else prefetch
        h = r["host_feed"].setdefault(f"{workers},{name}",
                                      {"batches_per_s": [], "cores_busy": []})
        h["batches_per_s"].append(rate)
        h["cores_busy"].append(busy)
        for depth in (int(x) for x in args.prefetch_to_device.split(",")):
            c = loader_run(s["ds"], sharding, step, w, k, workers, prefetch, depth, args.warmup,
                           n, args.executor)
            print(f"  {json.dumps({a: _rounded(b) for a, b in c.items()})}", flush=True)
            key = (workers, name, depth)
            found = [x for x in r["configs"]
                     if (x["workers"], x["prefetch"], x["prefetch_to_device"]) == key]
            if not found:
                found = [{"workers": workers, "prefetch": name, "prefetch_to_device": depth,
                          "runs": []}]
                r["configs"].append(found[0])
            found[0]["runs"].append(c)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import aioloader

    devices = jax.devices()
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    res: dict[str, Any] = {
        "argv": sys.argv[1:], "python": platform.python_version(), "jax": jax.__version__,
        "numpy": np.__version__, "aioloader": os.path.dirname(aioloader.__file__),
        "backend": jax.default_backend(), "devices": [d.device_kind for d in devices],
        "cpu_count": os.cpu_count(), "dim": args.dim, "repeats": args.repeats,
        "executor": args.executor,
        "workloads": {},
    }
    print(f"jax {jax.__version__} on {res['backend']}: {res['devices']}; "
          f"{os.cpu_count()} CPUs", flush=True)
    w = (jax.random.normal(jax.random.key(0), (args.dim, args.dim), jnp.float32)
         / args.dim ** 0.5).astype(jnp.bfloat16)
    with tempfile.TemporaryDirectory(prefix="bench_to_jax-") as tmp:
        t = time.perf_counter()
        paths, sums = write_data(Path(tmp), args.text_records, args.image_records, args.shards,
                                 args.compression)
        print(f"wrote the data in {time.perf_counter() - t:.1f} s", flush=True)
        # The first pool of the process starts the forkserver once; time it apart.
        t = time.perf_counter()
        with dataset(paths["text"], "text").loader(workers=1) as ld:
            next(iter(ld))
        res["first_pool_start_s"] = time.perf_counter() - t
        kinds = args.workloads.split(",")
        state = {kind: setup(kind, dataset(paths[kind], kind), sums, w, sharding, args.step_ms)
                 for kind in kinds}
        for rep in range(args.repeats):
            for kind in kinds:
                print(f"repeat {rep + 1}/{args.repeats}, {kind}", flush=True)
                one_repeat(state[kind], w, sharding, args)
        res["workloads"] = {kind: state[kind]["record"] for kind in kinds}
    md = table(res)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(res, indent=1))
        (out / "results.md").write_text(md)
    return res


if __name__ == "__main__":
    # Import this file under its own name, so that worker processes can import the transforms
    # (`bench_to_jax.tokens`) rather than look for them in their own `__main__`.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_to_jax

    bench_to_jax.main()
