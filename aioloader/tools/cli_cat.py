"""`aioloader cat`: records of a file (ArrayRecord, TFRecord or Parquet; or a glob's files,
numbered across them) to stdout, as
raw bytes (nothing added unless `--separator` says), hex or JSON lines, or one .npy array
(Parquet rows: JSON lines, {"index", "row"}); and
opening one file for the CLI's commands. The argument parser is `aioloader.tools.cli`'s; this
is what the command does with what it parsed. Output goes to stdout's descriptor in a loop, so
no short write loses bytes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import sys
from collections.abc import Iterator
from typing import Any

from .. import formats as fmts
from ..arrayrecord import DEFAULT_VERIFY
from ..source import ArrayRecordSource
from .cli_npy import write_npy

__all__ = ["cmd_cat", "open_one", "parse_separator"]

# What each format writes after a record unless --separator says otherwise.
_SEPARATORS = {"raw": b"", "hex": b"\n", "json": b"\n"}
_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "0": b"\0", "\\": b"\\"}


def open_one(path: str, verify: str = DEFAULT_VERIFY,
             storage_options: dict[str, Any] | None = None,
             record_format: str | None = None) -> ArrayRecordSource:
    """One file (local path or URL) as a source, of `record_format` (default: as its name
    suggests, `formats.guess`); errors name the file."""
    src = ArrayRecordSource(path, verify=verify, storage_options=storage_options,
                            format=record_format or fmts.guess(path))
    len(src)  # open now, so errors surface here
    return src


def parse_separator(text: str) -> bytes:
    """`--separator`'s text as bytes: UTF-8, with \\n \\t \\r \\0 \\\\ and \\xHH."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode("utf-8", "surrogateescape")
            i += 1
            continue
        code = text[i + 1:i + 2]
        if code in _ESCAPES:
            out += _ESCAPES[code]
            i += 2
        elif code == "x" and len(text) >= i + 4 and all(
                h in "0123456789abcdefABCDEF" for h in text[i + 2:i + 4]):
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            raise SystemExit(f"aioloader cat: --separator: unknown escape {text[i:i + 2]!r} "
                             "(\\n \\t \\r \\0 \\\\ \\xHH)")
    return bytes(out)


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
    if args.format == "npy" and args.separator is not None:
        raise SystemExit("aioloader cat: --separator does not go with --format npy (one "
                         "array, no separators)")
    sep = _SEPARATORS.get(args.format, b"") if args.separator is None else \
        parse_separator(args.separator)
    with open_one(args.path, verify=args.verify,
                  storage_options=getattr(args, "storage_options", None),
                  record_format=getattr(args, "record_format", None)) as src:
        if args.format == "npy" and fmts.base(src.formats[0]) in fmts.COLUMNAR:
            raise SystemExit(f"aioloader cat: {args.path} holds rows (Parquet), not "
                             "bytes: print them with --format json")
        if args.format == "npy":
            _write_all(write_npy(src, _records(src, args)))
        else:
            _write_records(src, args, sep)
    return 0


def _json_value(value: Any) -> Any:
    """A Parquet row's value as JSON takes it: NumPy scalars and arrays as numbers and
    lists, bytes as base64 ({"base64": ...}), anything else (dates, decimals) as its text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if hasattr(value, "tolist"):  # a NumPy scalar or array
        return value.tolist()
    return str(value)


def _write_records(src: ArrayRecordSource, args: argparse.Namespace, sep: bytes) -> None:
    pending = bytearray()
    for i, record in _records(src, args):
        if isinstance(record, dict):  # a Parquet row: JSON only
            if args.format != "json":
                raise SystemExit(f"aioloader cat: {src.urls[0]} holds rows (Parquet), not "
                                 "bytes: print them with --format json")
            pending += json.dumps({"index": i, "row": record}, ensure_ascii=False,
                                  default=_json_value).encode() + sep
        elif args.format == "hex":
            pending += record.hex().encode() + sep
        elif args.format == "raw":
            pending += record + sep
        else:
            try:
                item = {"index": i, "record": record.decode("utf-8")}
            except UnicodeDecodeError:
                item = {"index": i, "record_base64": base64.b64encode(record).decode()}
            pending += json.dumps(item, ensure_ascii=False).encode() + sep
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
