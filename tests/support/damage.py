"""Randomly damaged ArrayRecord files, read by us under default settings and by array_record.

Where tests/support/hostile.py crafts lies that keep every hash valid, this module damages honest
files the way storage and copies do: bit flips, overwritten bytes, zeroed sectors, ranges
copied over other ranges, bytes inserted or lost, truncations. The files come from both
writers (ours and array_record's, which alone writes transposed chunks), every codec, group
sizes 1 and 5. `judge` reads a damaged file every way aioloader does, with no options (the
defaults), and array_record's own reader as the oracle; it counts the records any path
returned wrong without an error ("silent"), and which side refused the file.

    python -m tests.support.damage START STOP   # a summary of cases [START, STOP)
"""

from __future__ import annotations

import functools
import os
import random
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field

import aioloader
from aioloader.arrayrecord import ArrayRecordFormatError, RangeReader
from aioloader.arrayrecord.index import decode_records
from aioloader.arrayrecord.layout import BLOCK_SIZE

from .arrayrecord_util import read_theirs, write_theirs
from .hostile_run import NAME, decoder_reads  # its worker reads a copy named NAME

WRITERS = ("ours", "theirs", "theirs-transposed")
CODECS = ("uncompressed", "zstd:3", "brotli:6", "snappy")
GROUPS = (1, 5)
CONFIGS = [(w, c, g) for w in WRITERS for c in CODECS for g in GROUPS]
DAMAGE = ("flip", "bytes", "zero", "splice", "shift", "truncate")


@functools.cache
def records() -> tuple[bytes, ...]:
    """Protocol-buffer-shaped records (field 1, bytes), so transposition has fields to split:
    mostly small, text and noise mixed, and three of ~30 KB so chunks cross block boundaries."""
    rng = random.Random(7)
    out = []
    for i in range(40):
        n = 30_000 + i if i in (6, 19, 33) else rng.randint(0, 300)
        body = (b"record %d " % i + rng.randbytes(n // 2) + b"text " * n)[:n]
        out.append(b"\x0a" + _varint(len(body)) + body)
    return tuple(out)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


@functools.cache
def base_file(writer: str, codec: str, group: int) -> bytes:
    """The undamaged file, written once per configuration."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, NAME)
        if writer == "ours":
            with aioloader.ArrayRecordWriter(path, group_size=group, compression=codec) as w:
                for r in records():
                    w.write(r)
        else:
            transpose = ",transpose:true" if writer.endswith("transposed") else ""
            write_theirs(path, records(), f"group_size:{group}{transpose},{codec}")
        with open(path, "rb") as f:
            return f.read()


@dataclass
class Case:
    index: int
    config: tuple[str, str, int]
    damage: str
    detail: str
    data: bytes

    def __str__(self) -> str:
        w, c, g = self.config
        return (f"case {self.index}: {w} writer, {c}, group {g}; {self.damage} {self.detail}; "
                f"rerun: python -m tests.support.damage {self.index} {self.index + 1}")


def make_case(index: int) -> Case:
    """Case `index`: configuration `index % len(CONFIGS)`, a damage drawn from `index`."""
    config = CONFIGS[index % len(CONFIGS)]
    rng = random.Random(f"damage-{index}")
    buf = bytearray(base_file(*config))
    n = len(buf)
    # Mostly where chunks lie: the last block is the postscript, padded with zeros.
    at = rng.randrange(n - BLOCK_SIZE + 256) if rng.random() < 0.8 else rng.randrange(n)
    kind = DAMAGE[index // len(CONFIGS) % len(DAMAGE)]
    if kind == "flip":
        bit = rng.randrange(8)
        buf[at] ^= 1 << bit
        detail = f"bit {bit} of byte {at}"
    elif kind == "bytes":
        k = rng.randint(1, 16)
        buf[at : at + k] = rng.randbytes(k)[: n - at]
        detail = f"{k} random bytes at {at}"
    elif kind == "zero":
        at -= at % 512
        k = rng.choice((512, 4096))
        buf[at : at + k] = bytes(min(k, n - at))
        detail = f"{k} bytes zeroed at {at}"
    elif kind == "splice":
        k = rng.randint(1, 4096)
        src = rng.randrange(n - k)
        buf[at : at + k] = buf[src : src + k][: n - at]
        detail = f"{k} bytes from {src} copied to {at}"
    elif kind == "shift":
        k = rng.randint(1, 64)
        if rng.random() < 0.5:
            del buf[at : at + k]
            buf += bytes(k)  # the size stays a whole number of blocks
            detail = f"{k} bytes lost at {at}"
        else:
            buf[at:at] = rng.randbytes(k)
            del buf[n:]
            detail = f"{k} bytes inserted at {at}"
    else:
        del buf[at:]
        if rng.random() < 0.5:
            buf += bytes(-len(buf) % BLOCK_SIZE)
        detail = f"to {at} bytes{' and zero-padded' if len(buf) > at else ''}"
    return Case(index, config, kind, detail, bytes(buf))


# -- reading -------------------------------------------------------------------------------


def _ours(path: str, data: bytes) -> dict[str, list[bytes] | ArrayRecordFormatError]:
    """Every way aioloader reads a file, with default settings: each path's records or its
    error. Any exception but ArrayRecordFormatError propagates."""
    out: dict[str, list[bytes] | ArrayRecordFormatError] = {}

    def attempt(name, fn):
        try:
            out[name] = fn()
        except ArrayRecordFormatError as err:
            out[name] = err

    def source():
        with aioloader.ArrayRecordSource(path) as src:
            return [src[i] for i in range(len(src))]

    reader = None

    def iterate():
        nonlocal reader
        reader = RangeReader(lambda o, n: data[o : o + n], len(data), path=NAME)
        return list(reader)

    attempt("ArrayRecordSource[i]", source)
    attempt("RangeReader iteration", iterate)
    if reader is None:  # the file does not open: nothing more to read
        return out
    ix, n = reader.index, len(reader)
    chunks, within = ix.locate(range(n))
    ranges = [ix.chunk_range(int(c)) for c in chunks]
    attempt("RangeReader.read", lambda: reader.read(list(range(n))[::-1])[::-1])
    attempt("decode_records", lambda: decode_records(
        [data[s:e] for s, e in ranges], [s for s, _ in ranges], within.tolist(),
        paths=[NAME] * n, chunks=chunks.tolist(), counts=ix.chunk_records[chunks].tolist()))
    attempt("worker Decoder", lambda: decoder_reads(data, ix, chunks, within, None, {}))
    return out


def _theirs(path: str) -> list[bytes] | Exception:
    try:
        return read_theirs(path)
    except Exception as err:  # array_record raises RuntimeError, ValueError...
        return err


@dataclass
class Verdict:
    silent: int = 0  # records one of our paths returned wrong, without an error
    problems: list[str] = field(default_factory=list)
    we_refused: bool = False
    they_refused: bool = False
    they_silent: int = 0  # records array_record returned wrong without an error


def _wrong(got: list[bytes], want: tuple[bytes, ...]) -> int:
    return sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))


def judge(case: Case) -> Verdict:
    """Read `case` both ways; what went wrong, if anything."""
    v = Verdict()
    want = records()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, NAME)
        with open(path, "wb") as f:
            f.write(case.data)
        theirs = _theirs(path)
        try:
            ours = _ours(path, case.data)
        except Exception as err:
            v.problems.append(f"{case}: {type(err).__name__}: {err}")
            return v
    v.they_refused = isinstance(theirs, Exception)
    if not v.they_refused:
        v.they_silent = _wrong(theirs, want)
    for how, got in ours.items():
        if isinstance(got, ArrayRecordFormatError):
            v.we_refused = True
            if NAME not in str(got):
                v.problems.append(f"{case}: {how}'s error does not name the file: {got}")
            continue
        wrong = _wrong(got, want)
        v.silent += wrong
        if wrong:
            v.problems.append(f"{case}: {how} returned {wrong} wrong records, no error")
        elif v.they_refused:
            v.problems.append(f"{case}: {how} read it, array_record refused it: {theirs}")
    return v


def run(cases: Iterable[int]) -> tuple[dict[str, int], list[str]]:
    """The totals over `cases` (their indices), and every problem."""
    totals = dict(files=0, silent=0, we_refused=0, they_refused=0, they_silent=0,
                  only_we_refused=0)
    problems: list[str] = []
    for i in cases:
        v = judge(make_case(i))
        totals["files"] += 1
        totals["silent"] += v.silent
        totals["we_refused"] += v.we_refused
        totals["they_refused"] += v.they_refused
        totals["they_silent"] += v.they_silent
        totals["only_we_refused"] += v.we_refused and not v.they_refused
        problems += v.problems
    return totals, problems


if __name__ == "__main__":
    totals, problems = run(range(int(sys.argv[1]), int(sys.argv[2])))
    print("\n".join(problems[:50]))
    print(totals)
