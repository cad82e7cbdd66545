"""Decode speed of transposed chunks vs simple chunks, on the same proto records.

array_record writes the same records twice (transpose:true and transpose:false, same codec
and group size); we decode every data chunk of each file in memory (no I/O) with
`decode_chunk`, alternating A, B, B, A so drift hits both, and report CPU µs per record
(medians and ranges over repeats) and the ratio transposed ÷ simple per repeat.

    PYTHONPATH=$PWD python -m benchmarks.bench_transposed [--records N] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import struct
import tempfile
import time
from itertools import pairwise

from aioloader.arrayrecord import decode_chunk
from aioloader.arrayrecord.index import read_index
from aioloader.arrayrecord.varint import encode_varint


def _field(no: int, wire: int, payload: bytes) -> bytes:
    return encode_varint(no << 3 | wire) + payload


def make_records(n: int, seed: int = 0) -> list[bytes]:
    """~120-byte feature rows: ids, a label, floats, a name, a nested box."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = f"image-{i:08d}.jpg".encode()
        box = b"".join(_field(k, 5, struct.pack("<f", rng.random())) for k in (1, 2, 3, 4))
        out.append(b"".join((
            _field(1, 0, encode_varint(i)),
            _field(2, 0, encode_varint(rng.randrange(1000))),
            _field(3, 2, encode_varint(len(name)) + name),
            *(_field(4, 5, struct.pack("<f", rng.random())) for _ in range(8)),
            _field(5, 2, encode_varint(len(box)) + box),
        )))
    return out


def chunks_of(path: str) -> list[tuple[bytes, int]]:
    with open(path, "rb") as f:
        raw = f.read()
    index = read_index(len(raw), lambda off, length: raw[off : off + length])
    offs = [int(o) for o in index.chunk_offsets] + [index.footer_offset]
    return [(raw[a:b], a) for a, b in pairwise(offs)]


def decode_all(chunks) -> float:
    t0 = time.process_time()
    for raw, start in chunks:
        decode_chunk(raw, start)[1].records()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--options", default="group_size:64,zstd")
    args = ap.parse_args()
    from array_record.python.array_record_module import ArrayRecordWriter

    records = make_records(args.records)
    files = {}
    with tempfile.TemporaryDirectory() as d:
        for name, transpose in (("simple", "false"), ("transposed", "true")):
            path = os.path.join(d, name + ".ar")
            w = ArrayRecordWriter(path, f"{args.options},transpose:{transpose}")
            for r in records:
                w.write(r)
            w.close()
            files[name] = (chunks_of(path), os.path.getsize(path))
    times: dict[str, list[float]] = {"simple": [], "transposed": []}
    for rep in range(args.repeats):
        order = ("simple", "transposed") if rep % 2 == 0 else ("transposed", "simple")
        for name in order:
            times[name].append(decode_all(files[name][0]) / args.records * 1e6)
    print(f"{args.records} records of ~{sum(map(len, records)) // len(records)} B, "
          f"options {args.options}, {args.repeats} repeats (ABBA), CPU µs per record:")
    for name, ts in times.items():
        print(f"  {name:<10}  median {statistics.median(ts):7.2f}  "
              f"range {min(ts):.2f}-{max(ts):.2f}  file {files[name][1]:,} B")
    ratios = [t / s for t, s in zip(times["transposed"], times["simple"])]
    print(f"  transposed / simple: median {statistics.median(ratios):.1f}x  "
          f"range {min(ratios):.1f}-{max(ratios):.1f}x")


if __name__ == "__main__":
    main()
