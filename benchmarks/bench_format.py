"""The format layer against array_record's C++ reader and writer, on the same files.

What it measures, each side by side with array_record 0.8.x in the same run:
- sequential decode of a whole file (open + every record as bytes), 1 KiB JSON and 64 KiB
  image records, group_size 1 and 1000: `RangeReader.read_chunk` (one pread per chunk) and
  `decode_chunk` over 4 MiB preads vs `ArrayRecordReader.read_all()` and a `read()` loop.
  Riegeli's reader always checks chunk data hashes, so verify="all" is the like-for-like row;
  verify="headers" is aioloader's default. array_record decodes ahead on a thread pool, so
  the tables also give cores busy and the ratio per CPU-second;
- random access, 256 shuffled indices per call: `RangeReader.read` vs `ArrayRecordReader.read`
  (opened with Grain's options);
- what hashing costs: header and data hashes per record, raw HighwayHash-64 speed (also
  alone, per implementation and input size: `--only hash`, no dataset needed);
- writer throughput on the same records.

Why: the format layer is the floor under every pipeline; any per-record Python cost here
caps the loader, and the ratios show where it is ahead of or behind the C++ reference.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from aioloader import ArrayRecordWriter as AioWriter
from aioloader.arrayrecord import RangeReader, decode_chunk, read_index
from aioloader.arrayrecord.hashing import highwayhash64

from .common import (
    Row,
    Stats,
    alternate,
    data_dir,
    dataset,
    load_records,
    log,
    register,
    repeats,
    throughput_row,
)

BATCH = 256  # indices per random-access call, like a training batch
SPAN = 4 << 20  # bytes per pread in the batched-I/O variant


def sizes(args: Any) -> dict[str, int]:
    if args.quick:
        return {"text": 20_000, "img": 1_000, "calls": 20}
    return {"text": 100_000, "img": 5_000, "calls": 60}


LABEL = {"text": "text 1 KiB", "img": "img 64 KiB"}


class PreadFile:
    """A file opened for `os.pread`; `fetch(offset, length)` is what RangeReader wants."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def fetch(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> PreadFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the contenders ---------------------------------------------------------------------------


def aio_sequential(path: Path, verify: str) -> list[bytes]:
    """Open, then every chunk through `RangeReader.read_chunk` (one pread per chunk)."""
    with PreadFile(path) as f:
        reader = RangeReader(f.fetch, f.size, path=f.path, verify=verify)
        out: list[bytes] = []
        for c in range(reader.index.num_chunks):
            out.extend(reader.read_chunk(c).records())
        return out


def aio_sequential_spans(path: Path, verify: str) -> list[bytes]:
    """Open, then pread ~4 MiB spans of whole chunks and `decode_chunk` each from the span:
    what a pipeline that batches its I/O gets (one syscall per span, not per chunk)."""
    with PreadFile(path) as f:
        index = read_index(f.size, f.fetch, path=f.path, verify=verify)
        starts, ends = index.chunk_offsets.tolist(), index.chunk_ends.tolist()
        out: list[bytes] = []
        c, n = 0, len(starts)
        while c < n:
            base = starts[c]
            stop = max(c + 1, int(np.searchsorted(index.chunk_ends, base + SPAN, "right")))
            buf = memoryview(f.fetch(base, ends[stop - 1] - base))
            for k in range(c, stop):
                _, records = decode_chunk(buf[starts[k] - base : ends[k] - base], starts[k],
                                          verify=verify, path=f.path, chunk=k)
                out.extend(records.records())
            c = stop
        return out


def ar_read_all(path: Path) -> list[bytes]:
    """Open, then `read_all()` (C++, decodes ahead on a thread pool)."""
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path))
    try:
        return reader.read_all()
    finally:
        reader.close()


def ar_read_loop(path: Path) -> list[bytes]:
    """Open, then `read()` one record per call: what a Python loop over the reader gets."""
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path))
    try:
        read = reader.read
        return [read() for _ in range(reader.num_records())]
    finally:
        reader.close()


def ar_random_reader(path: Path):
    """Opened the way Grain's ArrayRecordDataSource opens it (tuned for random access)."""
    from array_record.python.array_record_module import ArrayRecordReader

    return ArrayRecordReader(str(path), "readahead_buffer_size:0",
                             file_reader_buffer_size=32768)


# -- sections ---------------------------------------------------------------------------------


def _check_same(kind: str, ours: list[bytes], theirs: list[bytes]) -> None:
    if ours != theirs:
        raise AssertionError(f"{kind}: aioloader and array_record disagree on the records")


def bench_sequential(args: Any, n: dict[str, int]) -> list[Row]:
    rows = []
    for kind in ("text", "img"):
        for group in (1, 1000):
            path = dataset(args, kind, n[kind], group)
            fns: dict[str, Callable[[], object]] = {
                "headers": lambda p=path: aio_sequential(p, "headers"),
                "read_all": lambda p=path: ar_read_all(p),
                "all": lambda p=path: aio_sequential(p, "all"),
            }
            if group == 1:
                fns["spans"] = lambda p=path: aio_sequential_spans(p, "headers")
                fns["read"] = lambda p=path: ar_read_loop(p)
            log(f"format: sequential {kind} group_size {group}")
            expected = ar_read_all(path)  # with the checks below: every contender ran once
            for name, fn in fns.items():
                if name != "read_all":
                    _check_same(f"{path.name} {name}", fn(), expected)  # type: ignore[arg-type]
            del expected
            t = alternate(fns, repeats(args), warmup=0)
            count = n[kind]
            mb = 1024 if kind == "text" else 65536  # bytes per record
            what = f"sequential decode, {LABEL[kind]}, group {group}"
            rows.append(throughput_row(what, t["headers"], t["read_all"], count, "rec/s", mb,
                                       "read_chunk, verify=headers vs read_all()"))
            rows.append(throughput_row(what, t["all"], t["read_all"], count, "rec/s", mb,
                                       "read_chunk, verify=all vs read_all(): like-for-like"))
            if group == 1:
                rows.append(throughput_row(what, t["spans"], t["read_all"], count, "rec/s", mb,
                                           "decode_chunk over 4 MiB preads vs read_all()"))
                rows.append(throughput_row(what, t["headers"], t["read"], count, "rec/s", mb,
                                           "read_chunk, verify=headers vs read() loop"))
    return rows


def bench_random(args: Any, n: dict[str, int]) -> list[Row]:
    rows = []
    rng = np.random.default_rng(1)
    for kind in ("text", "img"):
        path = dataset(args, kind, n[kind], 1)
        calls = n["calls"] if kind == "text" else max(4, n["calls"] // 4)
        batches = [rng.permutation(n[kind])[:BATCH] for _ in range(calls)]
        lists = [b.tolist() for b in batches]
        with PreadFile(path) as f:
            ours = RangeReader(f.fetch, f.size, path=f.path, verify="headers")
            theirs = ar_random_reader(path)
            try:
                log(f"format: random access {kind}")
                _check_same(path.name, ours.read(batches[0]), theirs.read(lists[0]))
                t = alternate({
                    "ours": lambda r=ours, bs=batches: [r.read(b) for b in bs],
                    "peer": lambda r=theirs, bs=lists: [r.read(b) for b in bs],
                }, repeats(args))
            finally:
                theirs.close()
        mb = 1024 if kind == "text" else 65536
        rows.append(throughput_row(f"random access, {LABEL[kind]}, group 1", t["ours"], t["peer"],
                                   calls * BATCH, "rec/s", mb,
                                   f"{BATCH} shuffled indices per read() call"))
    return rows


def _chunks_in_memory(path: Path) -> list[tuple[memoryview, int]]:
    """Every data chunk of a file as (physical bytes, file offset), read once up front."""
    with PreadFile(path) as f:
        index = read_index(f.size, f.fetch, path=f.path)
        whole = memoryview(f.fetch(0, f.size))
    return [(whole[s:e], s) for s, e in zip(index.chunk_offsets.tolist(),
                                            index.chunk_ends.tolist(), strict=True)]


def _interleaved_decode(chunks: list[tuple[memoryview, int]], rounds: int,
                        block: int = 250) -> dict[str, list[float]]:
    """Seconds per round to `decode_chunk` every chunk at each verify level.

    The levels alternate every `block` chunks (in rotating order), not every file, so that
    drift on a shared machine cannot masquerade as the sub-microsecond cost of a hash."""
    levels = ("none", "headers", "all")
    out: dict[str, list[float]] = {v: [] for v in levels}
    clock = time.perf_counter
    for r in range(rounds + 1):  # round 0 warms up
        total = dict.fromkeys(levels, 0.0)
        for b, lo in enumerate(range(0, len(chunks), block)):
            part = chunks[lo : lo + block]
            for k in range(len(levels)):
                v = levels[(b + k) % len(levels)]
                t = clock()
                for raw, start in part:
                    decode_chunk(raw, start, verify=v)
                total[v] += clock() - t
        if r:
            for v in levels:
                out[v].append(total[v])
    return out


def bench_hashing(args: Any, n: dict[str, int]) -> list[Row]:
    """What verification costs inside `decode_chunk` (chunks from memory, no I/O): verify
    none / headers / all, interleaved; the differences are the hashes' cost per record."""
    log("format: hashing")
    rows = []
    for kind in ("text", "img"):
        chunks = _chunks_in_memory(dataset(args, kind, n[kind], 1))
        count = len(chunks)  # group 1: one record per chunk
        hashed = sum(decode_chunk(raw, s, verify="none")[0].data_size for raw, s in chunks)
        t = _interleaved_decode(chunks, repeats(args))
        us = {v: [s * 1e6 / count for s in secs] for v, secs in t.items()}
        hdr = [h - z for h, z in zip(us["headers"], us["none"], strict=True)]
        data = [a - h for a, h in zip(us["all"], us["headers"], strict=True)]
        where = f"{LABEL[kind]}, group 1, decode_chunk from memory"
        rows.append(Row(f"decode, {where}", "µs/rec", Stats.of(us["none"]),
                        note="verify=none"))
        rows.append(Row(f"header-hash cost, {where}", "µs/rec", Stats.of(hdr),
                        note="verify=headers − none"))
        rows.append(Row(f"data-hash cost, {where}", "µs/rec", Stats.of(data),
                        note=f"verify=all − headers, {hashed / count:.0f} B hashed per record"))
        if kind == "img":  # large enough that the difference is a clean speed
            rows.append(Row(f"data-hash speed, {where}", "MB/s",
                            Stats.of(hashed / count / d for d in data if d > 0),
                            note="compressed chunk data, verify=all − headers"))

    loops = 50_000 if args.quick else 200_000
    header = bytes(range(32))
    h = highwayhash64

    def hash_headers() -> None:
        for _ in range(loops):
            h(header)

    big = np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    reps = 50 if args.quick else 200

    def hash_big() -> None:
        for _ in range(reps):
            h(big)

    raw = alternate({"hdr": hash_headers, "big": hash_big}, repeats(args))
    rows.append(Row("highwayhash64, 32-byte header", "ns/call",
                    Stats.of(s * 1e9 / loops for s in raw["hdr"].wall),
                    note="incl. the Python call"))
    rows.append(Row("highwayhash64, 1 MiB buffer", "MB/s",
                    Stats.of(reps * len(big) / s / 1e6 for s in raw["big"].wall)))
    return rows


#: Sizes the raw hash benchmark times: an empty input (the call and finalization alone), a
#: chunk header, a text record's chunk, an image record's chunk, a large buffer.
HASH_SIZES = (0, 32, 600, 65536, 1 << 20)


def bench_hash_speed(args: Any) -> list[Row]:
    """HighwayHash-64 itself, per call and per byte: the implementation this CPU uses
    against the portable C loop (what every CPU ran before the AVX2 path), alternating."""
    from aioloader.arrayrecord import _highwayhash
    from aioloader.arrayrecord.hashing import RIEGELI_KEY

    rng = np.random.default_rng(5)
    budget = 2e6 if args.quick else 2e7  # bytes hashed per timed run (at least 20k calls)
    fns: dict[str, Callable[[], object]] = {}
    calls: dict[int, int] = {}
    for size in HASH_SIZES:
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        calls[size] = loops = max(20_000 if not args.quick else 5_000, int(budget // max(size, 1)))
        for impl in _highwayhash.IMPLS:
            h = _highwayhash.hash64_impl

            def run(h=h, impl=impl, data=data, loops=loops) -> None:
                for _ in range(loops):
                    h(impl, RIEGELI_KEY, data)

            fns[f"{impl}:{size}"] = run
        if size <= 600:  # what the reader calls: hash64(data), no implementation argument

            def direct(h=_highwayhash.hash64, data=data, loops=loops) -> None:
                for _ in range(loops):
                    h(data)

            fns[f"direct:{size}"] = direct
    log("hash: HighwayHash-64 per call and per byte")
    t = alternate(fns, repeats(args))
    chosen = _highwayhash.IMPL
    rows = []
    for size in HASH_SIZES:
        ns = {impl: [w * 1e9 / calls[size] for w in t[f"{impl}:{size}"].wall]
              for impl in _highwayhash.IMPLS}
        ours, peer = ns[chosen], ns["portable"]
        what = f"highwayhash64, {size:,} bytes" + (" (call + finalization)" if not size else "")
        note = f"{chosen} vs portable C; incl. the Python call (hash64_impl)"
        rows.append(Row(what, "ns/call", Stats.of(ours), Stats.of(peer),
                        Stats.of(p / o for o, p in zip(ours, peer, strict=True)), note=note))
        if size >= 600:
            rows.append(Row(what, "MB/s", Stats.of(size / x * 1e3 for x in ours),
                            Stats.of(size / x * 1e3 for x in peer),
                            Stats.of(p / o for o, p in zip(ours, peer, strict=True)),
                            note=note))
    for size in (s for s in HASH_SIZES if s <= 600):
        rows.append(Row(f"hash64(data), {size:,} bytes", "ns/call",
                        Stats.of(w * 1e9 / calls[size] for w in t[f"direct:{size}"].wall),
                        note=f"{chosen}; the call the reader makes, incl. Python's call"))
    return rows


@register("hash", "HighwayHash-64 speed: this CPU's implementation vs the portable C loop",
          peer="portable C")
def run_hash(args: Any) -> list[Row]:
    return bench_hash_speed(args)


def bench_writer(args: Any, n: dict[str, int]) -> list[Row]:
    from array_record.python.array_record_module import ArrayRecordWriter as ArWriter

    rows = []
    tmp = data_dir(args)
    ours_path, peer_path = tmp / "_write_aioloader.tmp", tmp / "_write_array_record.tmp"
    try:
        for kind in ("text", "img"):
            records = load_records(args, kind, n[kind])
            total = sum(map(len, records))
            for group in (1, 1000):

                def ours(g=group, recs=records) -> None:
                    with AioWriter(ours_path, group_size=g, compression="zstd:3") as w:
                        for r in recs:
                            w.write(r)

                def peer(g=group, recs=records) -> None:
                    w = ArWriter(str(peer_path), f"group_size:{g}")
                    for r in recs:
                        w.write(r)
                    w.close()

                log(f"format: writer {kind} group_size {group}")
                t = alternate({"ours": ours, "peer": peer}, repeats(args))
                size_ratio = os.path.getsize(ours_path) / os.path.getsize(peer_path)
                rows.append(throughput_row(
                    f"write, {LABEL[kind]}, group {group}, zstd:3", t["ours"], t["peer"],
                    len(records), "rec/s", total / len(records),
                    f"file size aioloader ÷ array_record {size_ratio:.3f}"))
            del records
    finally:
        for p in (ours_path, peer_path):
            p.unlink(missing_ok=True)
    return rows


@register("format", "ArrayRecord decode, random access, hashing and writing",
          peer="array_record")
def run(args: Any) -> list[Row]:
    n = sizes(args)
    start = time.perf_counter()
    rows = bench_sequential(args, n)
    rows += bench_random(args, n)
    rows += bench_hashing(args, n)
    rows += bench_writer(args, n)
    log(f"format: done in {time.perf_counter() - start:.0f} s")
    return rows
