"""Image decode against the machine's limit (issue 15): where a 64 KiB record's time goes.

The `pipeline` benchmark's image dataset (128×128×4 uint8, noisy enough that zstd stores
them nearly raw, written by array_record's writer with group_size 1: one ~64 KiB chunk per
record, crossing a block boundary), read in a global shuffle, 256 records a batch, all in
this process:

- the limit: for each record, a `preadv` of its chunk (block headers put aside) into one
  reused buffer and the zstd decode of its values block (`zstandard`, output size given:
  a new `bytes` per record, kept for the batch, as a decoder must), nothing else; and the
  same decoding into a preallocated batch (`cramjam.zstd.decompress_into`);
- ours: `aioloader.workers.decode.Decoder.records`, the very call a worker makes for a task
  (files read by the decoder itself), at verify="headers" (the default) and "all";
- the limit plus the collate (the records stacked into one batch array, as the pipeline's
  `np.frombuffer(...).reshape` + batch does), and the whole pipeline with workers=0 and 2
  (after its first batch, so opening and spawning are left out);
- a cProfile of ours: µs per record in each function (tottime), the split of the 13 µs.

Every contender runs in turn within each repeat (A, B, A, B...); a row's ratio is ours ÷
the limit per repeat: the fraction of the limit reached. The in-process rows are timed in
CPU seconds (one thread: its CPU time is its cost, and the time other jobs of a shared
machine held the core is left out); the pipelines, several threads and processes, in wall
time after their first batch, with their CPU time (workers included) in the note.

`python -m benchmarks run --only decode [--quick] [--repeats N] [--data-dir DIR]`
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import statistics
import time
from typing import Any

import numpy as np

from .bench_pipeline import BATCH, IMG_BYTES, SHARDS, TEXT_BYTES, reps, sizes
from .common import Row, Runs, Stats, alternate, log, register, sharded_dataset, throughput_row
from .contenders import run as run_pipeline

BLOCK = 1 << 16
BLOCK_HEADER = 24


def _batches(paths: list[str]) -> tuple[Any, list[Any], int]:
    """The dataset's records in a global shuffle, as the refs of 256-record tasks."""
    from aioloader.source.api import ArrayRecordSource

    src = asyncio.run(ArrayRecordSource.open(paths))
    n = len(src)
    refs = src.chunk_refs(np.random.default_rng(0).permutation(n))
    return src, [refs.take(i, min(i + BATCH, n)) for i in range(0, n, BATCH)], n


class Limit:
    """pread + zstd of each record's chunk, the least a reader must do (see module doc)."""

    def __init__(self, paths: list[str]) -> None:
        import zstandard

        self.fds = {p: os.open(p, os.O_RDONLY) for p in paths}
        self.dctx = zstandard.ZstdDecompressor(max_window_size=1 << 31)
        self.buf = memoryview(bytearray(1 << 20))
        self.heads = memoryview(bytearray(BLOCK_HEADER * 16))
        self.slot = np.empty((BATCH, IMG_BYTES), np.uint8)

    def _read(self, fd: int, start: int, end: int) -> memoryview:
        """The chunk's logical bytes (block headers left out) in the reused buffer."""
        plan, lo, at, k = [], 0, 0, 0
        boundary = -start % BLOCK  # 0: the chunk begins with a block header
        while boundary < end - start:
            plan += [self.buf[at : at + boundary - lo],
                     self.heads[k * BLOCK_HEADER : (k + 1) * BLOCK_HEADER]]
            at += boundary - lo
            lo, boundary, k = boundary + BLOCK_HEADER, boundary + BLOCK, k + 1
        plan.append(self.buf[at : at + end - start - lo])
        os.preadv(fd, plan, start)
        return self.buf[: end - start - k * BLOCK_HEADER]

    @staticmethod
    def _stream(logical: memoryview) -> tuple[memoryview, int]:
        """The values block's zstd frame and its size (a one-record simple chunk)."""
        pos = 40 + 2 + logical[41]
        size, shift = 0, 0
        while True:
            b = logical[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return logical[pos:], size

    def records(self, refs: Any) -> list[bytes]:
        fds = [self.fds[p] for p in refs.paths]
        out = []
        for f, s, e in zip(refs.file.tolist(), refs.start.tolist(), refs.end.tolist()):
            stream, size = self._stream(self._read(fds[f], s, e))
            out.append(self.dctx.decompress(stream, max_output_size=size))
        return out

    def into_batch(self, refs: Any) -> np.ndarray:
        import cramjam

        fds = [self.fds[p] for p in refs.paths]
        slot = self.slot
        for k, (f, s, e) in enumerate(zip(refs.file.tolist(), refs.start.tolist(),
                                          refs.end.tolist())):
            stream, _ = self._stream(self._read(fds[f], s, e))
            cramjam.zstd.decompress_into(stream, slot[k])
        return slot

    def collated(self, refs: Any) -> np.ndarray:
        """The records, then stacked into the batch (the collate's one copy)."""
        records = self.records(refs)
        return np.stack([np.frombuffer(r, np.uint8) for r in records],
                        out=self.slot[: len(records)])


def _each(fn: Any, batches: list[Any]) -> Any:
    """`fn` of every batch, each result dropped when the next is made (as a worker does:
    keeping them all would time the page faults of fresh memory instead)."""
    out = None
    for b in batches:
        out = fn(b)
    return out


def _pipeline(paths: list[str], workers: int, decode: str = "decode_image"
              ) -> tuple[float, float]:
    """(seconds, CPU seconds) per record of the whole pipeline after its first batch."""
    res = run_pipeline({"lib": "aioloader", "paths": paths, "decode": decode,
                        "batch": BATCH, "seed": 0, "workers": workers})
    records = res["records"] - res["first_size"]
    return (res["wall"] - res["ttfb"]) / records, res["cpu"] / res["records"]


def _profile(decoder: Any, batches: list[Any], n: int, top: int = 8) -> list[Row]:
    prof = cProfile.Profile(time.process_time)  # CPU time: other jobs' turns left out
    prof.enable()
    for b in batches:
        decoder.records(b, None, verify="headers")
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(((tt, f"{os.path.basename(file)}:{name}" if file != "~" else name)
                   for (file, _, name), (_, _, tt, _, _) in stats.items()), reverse=True)
    total = sum(tt for tt, _ in rows)
    out = [Row(f"cProfile of ours, verify=headers: {name} (tottime)", "µs/rec",
               Stats(tt / n * 1e6, tt / n * 1e6, tt / n * 1e6)) for tt, name in rows[:top]]
    out.append(Row("cProfile of ours: everything (profiler overhead incl.)", "µs/rec",
                   Stats(total / n * 1e6, total / n * 1e6, total / n * 1e6)))
    return out


@register("decode", "64 KiB image records: pread + decode against the pread + zstd limit "
                    "(issue 15)", peer="limit")
def run_decode(args: Any) -> list[Row]:
    from aioloader.workers.decode import Decoder
    from aioloader.workers.worker import _raise_malloc_thresholds

    _raise_malloc_thresholds()  # as a worker does: else every batch faults its pages in
    n_img = sizes(args)["img"]
    paths = [str(p) for p in sharded_dataset(args, "img", n_img, SHARDS)]
    r = reps(args, 7, 3)
    _, batches, n = _batches(paths)
    limit = Limit(paths)
    decoder = Decoder()

    def each(fn: Any) -> Any:
        return lambda: _each(fn, batches)

    log(f"decode: {n} records, {r} repeats")
    runs = alternate({
        "limit": each(limit.records),
        "limit_into": each(limit.into_batch),
        "ours": each(lambda b: decoder.records(b, None, verify="headers")),
        "ours_all": each(lambda b: decoder.records(b, None, verify="all")),
        "ours_none": each(lambda b: decoder.records(b, None, verify="none")),
        "read": each(decoder.files.read),
    }, r)
    # Single-threaded work on a shared machine: its CPU time, not its wall time (which
    # counts the time other jobs held the core), is what each contender costs.
    runs = {k: Runs(v.cpu, v.cpu) for k, v in runs.items()}
    # The faster of the two limits, per repeat.
    best = Runs([min(a, b) for a, b in zip(runs["limit"].wall, runs["limit_into"].wall)],
                [min(a, b) for a, b in zip(runs["limit"].cpu, runs["limit_into"].cpu)])

    def us(name: str) -> str:
        return f"{statistics.median(runs[name].wall) / n * 1e6:.1f} µs"

    rows = [
        throughput_row("limit: preadv + zstandard decompress (new bytes per record)",
                       runs["limit"], None, n, "rec/s", IMG_BYTES, note=us("limit")),
        throughput_row("limit: preadv + cramjam decompress_into the batch",
                       runs["limit_into"], None, n, "rec/s", IMG_BYTES,
                       note=us("limit_into")),
    ]
    for name, what in (("ours", "headers"), ("ours_all", "all"), ("ours_none", "none")):
        rows.append(throughput_row(
            f"ours: Decoder.records (the worker's call), verify={what}, vs the limit",
            runs[name], best, n, "rec/s", IMG_BYTES, note=f"{us(name)} a record"))
    rows.append(throughput_row("the reads alone (LocalFiles.read: pread per record)",
                               runs["read"], best, n, "rec/s", IMG_BYTES, note=us("read")))

    # Whole pipelines (after the first batch) against the limit with the collate's copy.
    pipes: dict[str, Runs] = {"limit_collated": Runs([], []), "w0": Runs([], []),
                              "w2": Runs([], []), "w0_listed": Runs([], [])}
    _pipeline(paths, 0)
    for _ in range(r):
        for name in pipes:
            if name == "limit_collated":
                got = alternate({"x": each(limit.collated)}, 1, 0)["x"]
                wall, cpu = got.cpu[0] / n, got.cpu[0] / n
            elif name == "w0_listed":
                wall, cpu = _pipeline(paths, 0, "identity")
            else:
                wall, cpu = _pipeline(paths, int(name[1:]))
            pipes[name].wall.append(wall)
            pipes[name].cpu.append(cpu)
    rows.append(throughput_row("limit + collate (records stacked into the batch), 1 core",
                               pipes["limit_collated"], None, 1, "rec/s", IMG_BYTES))
    for w in (0, 2):
        rows.append(throughput_row(
            f"pipeline, np.frombuffer.reshape + batch 256, workers={w}, after the first "
            "batch, vs limit + collate on 1 core", pipes[f"w{w}"], pipes["limit_collated"],
            1, "rec/s", IMG_BYTES,
            note=f"{statistics.median(pipes[f'w{w}'].cpu) * 1e6:.1f} µs CPU a record "
                 "(workers incl.)"))
    rows.append(throughput_row(
        "pipeline, records listed as bytes (no np.stack), workers=0: the collate's share",
        pipes["w0_listed"], pipes["limit_collated"], 1, "rec/s", IMG_BYTES,
        note=f"{statistics.median(pipes['w0_listed'].cpu) * 1e6:.1f} µs CPU a record"))
    rows += _text(args, r)
    rows += _profile(decoder, batches, n)
    decoder.close()
    return rows


def _text(args: Any, r: int) -> list[Row]:
    """The same for 1 KiB text records (the short path must not cost them anything)."""
    from aioloader.workers.decode import Decoder

    paths = [str(p) for p in sharded_dataset(args, "text", sizes(args)["text"], SHARDS)]
    _, batches, n = _batches(paths)
    limit, decoder = Limit(paths), Decoder()

    def each(fn: Any) -> Any:
        return lambda: _each(fn, batches)

    runs = alternate({"limit": each(limit.records),
                      "ours": each(lambda b: decoder.records(b, None, verify="headers"))}, r)
    runs = {k: Runs(v.cpu, v.cpu) for k, v in runs.items()}
    decoder.close()
    return [
        throughput_row("text 1 KiB: limit, preadv + zstandard decompress", runs["limit"],
                       None, n, "rec/s", TEXT_BYTES,
                       note=f"{statistics.median(runs['limit'].wall) / n * 1e6:.2f} µs"),
        throughput_row("text 1 KiB: ours, Decoder.records, verify=headers, vs the limit",
                       runs["ours"], runs["limit"], n, "rec/s", TEXT_BYTES,
                       note=f"{statistics.median(runs['ours'].wall) / n * 1e6:.2f} µs"),
    ]
