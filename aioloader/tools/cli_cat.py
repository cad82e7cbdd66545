"""`aioloader cat`: records of a file (or a glob's files, numbered across them) to stdout, as
hex, JSON lines or raw bytes; and opening one file for the CLI's commands. The argument parser
is `aioloader.tools.cli`'s; this is what the command does with what it parsed. Output goes to
stdout's descriptor in a loop, so no short write loses bytes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import sys
from collections.abc import Iterator

from ..arrayrecord import DEFAULT_VERIFY
from ..source import ArrayRecordSource

__all__ = ["cmd_cat", "open_one"]


def open_one(path: str, verify: str = DEFAULT_VERIFY) -> ArrayRecordSource:
    """One file (local path or URL) as a source; errors name the file."""
    src = ArrayRecordSource(path, verify=verify)
    len(src)  # open now, so errors surface here
    return src



def _parse_range(text: str, n: int) -> range:
    start, sep, stop = text.partition(":")
    try:
        if not sep or ":" in stop:
            raise ValueError
        return range(*slice(int(start) if start else None,
                            int(stop) if stop else None).indices(n))
    except ValueError:
        raise SystemExit(f"aioloader cat: --range takes START:STOP, got {text!r}") from None


def _records(src: ArrayRecordSource, args: argparse.Namespace) -> Iterator[tuple[int, bytes]]:
    """(index, record) pairs asked for, in order, decoding each chunk once. Records are
    numbered across the files a glob names (sorted), as `ArrayRecordSource` numbers them."""
    n = len(src)
    if args.index is not None:
        i = args.index + n if args.index < 0 else args.index
        if not 0 <= i < n:
            raise SystemExit(f"aioloader cat: --index {args.index} out of range "
                             f"({_count(src)})")
        wanted = range(i, i + 1)
    else:
        wanted = _parse_range(args.range, n) if args.range else range(n)
    starts = src.table.starts.tolist()
    skips = src.table.first_records.tolist()  # a read instruction's start in its file
    for f, index in enumerate(src.file_indices):
        base = starts[f] - skips[f]  # where the file's record 0 would be numbered
        lo, hi = max(wanted.start, starts[f]), min(wanted.stop, starts[f + 1])
        if lo >= hi:
            continue
        first, last = index.locate([lo - base, hi - 1 - base])[0].tolist()
        for c in range(first, last + 1):
            at = base + int(index.record_starts[c])
            records = src.read_chunk(f, c)
            for j in range(max(lo - at, 0), min(hi - at, len(records))):
                yield at + j, records.record(j)


def _count(src: ArrayRecordSource) -> str:
    files = len(src.urls)
    return f"{len(src):,} records" + (f" in {files} files" if files > 1 else "")


def cmd_cat(args: argparse.Namespace) -> int:
    with open_one(args.path, verify=args.verify) as src:
        _write_records(src, args)
    return 0


def _write_records(src: ArrayRecordSource, args: argparse.Namespace) -> None:
    pending = bytearray()
    for i, record in _records(src, args):
        if args.format == "hex":
            pending += record.hex().encode() + b"\n"
        elif args.format == "raw":
            pending += record + b"\n"
        else:
            try:
                item = {"index": i, "record": record.decode("utf-8")}
            except UnicodeDecodeError:
                item = {"index": i, "record_base64": base64.b64encode(record).decode()}
            pending += json.dumps(item, ensure_ascii=False).encode() + b"\n"
        if len(pending) >= 1 << 20:
            _write_all(pending)
            pending.clear()
    _write_all(pending)


def _write_all(data: bytes | bytearray) -> None:
    """All of `data` to stdout's descriptor, however little each write takes (a full
    non-blocking pipe, a write cut short): Python's stdout drops the rest of a short write
    silently when unbuffered (`python -u`, PYTHONUNBUFFERED=1)."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError):  # not a real file (replaced in a test)
        sys.stdout.buffer.write(data)
        return
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]
