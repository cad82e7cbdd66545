"""The `aioloader` command: look inside ArrayRecord files, print their records.

    aioloader inspect PATH...      what a file holds: records, chunks, codec, options
    aioloader cat PATH             print records (hex is a stable, script-friendly format)

Paths are local files or any fsspec URL (gs://bucket/x.array_record with the `gcs` extra).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterator, Sequence

from .arrayrecord import ArrayRecordFormatError
from .source import ArrayRecordSource
from .storage import StorageError


def _open(path: str, verify: str = "headers") -> ArrayRecordSource:
    """One file (local path or URL) as a source; errors name the file."""
    src = ArrayRecordSource(path, verify=verify)
    len(src)  # open now, so errors surface here
    return src


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _describe(path: str) -> dict:
    with _open(path) as src:
        index = src.file_indices[0]
    opts = index.options
    n = index.num_records
    decoded = int(index.chunk_decoded_sizes.sum())
    return {
        "path": path,
        "file_size": index.size,
        "records": n,
        "chunks": index.num_chunks,
        "group_size": index.group_size,
        "compression": opts.compression.name if opts else "unknown",
        "compression_level": opts.compression.level if opts else None,
        "window_log": opts.compression.window_log if opts else None,
        "transpose": opts.transpose if opts else None,
        "options": index.writer_options,
        "decoded_bytes": decoded,
        "bytes_per_record": round(index.size / n, 2) if n else None,
        "decoded_bytes_per_record": round(decoded / n, 2) if n else None,
        "footer_offset": index.footer_offset,
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    infos = [_describe(p) for p in args.paths]
    if args.json:
        print(json.dumps(infos if len(infos) > 1 else infos[0], indent=2))
        return 0
    for k, info in enumerate(infos):
        if k:
            print()
        codec = info["compression"]
        if info["compression_level"] is not None:
            codec += f":{info['compression_level']}"
        if info["window_log"] is not None:
            codec += f" (window_log {info['window_log']})"
        rows = [
            ("path", info["path"]),
            ("file size", f"{_human(info['file_size'])} ({info['file_size']:,} bytes)"),
            ("records", f"{info['records']:,}"),
            ("chunks", f"{info['chunks']:,}"),
            ("group size", f"{info['group_size']:,}"),
            ("compression", codec),
            ("options", info["options"] or "(none stored: written before 2022)"),
        ]
        if info["records"]:
            rows += [
                ("bytes/record", f"{info['bytes_per_record']:,} on disk, "
                                 f"{info['decoded_bytes_per_record']:,} decoded"),
            ]
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
        if info["transpose"]:
            print("note: written with transpose; aioloader can index it but not decode it")
    return 0


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
    """(index, record) pairs asked for, in file order, decoding each chunk once."""
    n = len(src)
    if args.index is not None:
        i = args.index + n if args.index < 0 else args.index
        if not 0 <= i < n:
            raise SystemExit(f"aioloader cat: --index {args.index} out of range (file has {n})")
        wanted = range(i, i + 1)
    else:
        wanted = _parse_range(args.range, n) if args.range else range(n)
    if not wanted:
        return
    index = src.file_indices[0]
    first, last = index.locate([wanted.start, wanted.stop - 1])[0].tolist()
    for c in range(first, last + 1):
        lo = int(index.record_starts[c])
        records = src.read_chunk(0, c)
        for j in range(max(wanted.start - lo, 0), min(wanted.stop - lo, len(records))):
            yield lo + j, records.record(j)


def cmd_cat(args: argparse.Namespace) -> int:
    with _open(args.path, verify=args.verify) as src:
        _write_records(src, args)
    return 0


def _write_records(src: ArrayRecordSource, args: argparse.Namespace) -> None:
    out = sys.stdout.buffer
    for i, record in _records(src, args):
        if args.format == "hex":
            out.write(record.hex().encode() + b"\n")
        elif args.format == "raw":
            out.write(record + b"\n")
        else:
            try:
                item = {"index": i, "record": record.decode("utf-8")}
            except UnicodeDecodeError:
                item = {"index": i, "record_base64": base64.b64encode(record).decode()}
            out.write(json.dumps(item, ensure_ascii=False).encode() + b"\n")
    out.flush()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aioloader",
        description="Look inside ArrayRecord files, local or in a bucket (gs://...).",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("inspect", help="summarise files: records, chunks, codec, options",
                       description="Summarise ArrayRecord files: records, chunks, group "
                                   "size, codec, the stored writer options, bytes per record.")
    s.add_argument("paths", nargs="+", metavar="PATH", help="local path or fsspec URL")
    s.add_argument("--json", action="store_true", help="print JSON for machines")
    s.set_defaults(func=cmd_inspect)

    c = sub.add_parser(
        "cat", help="print records",
        description="Print records in file order. '--format hex' is a stable contract for "
                    "scripts: one record per line, lowercase hex, an empty line for an empty "
                    "record.",
    )
    c.add_argument("path", metavar="PATH", help="local path or fsspec URL")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--index", type=int, help="print only record INDEX (negative counts "
                                                 "from the end)")
    which.add_argument("--range", metavar="START:STOP",
                       help="print records START..STOP-1 (either may be omitted or negative)")
    c.add_argument("--format", choices=("raw", "hex", "json"), default="raw",
                   help="raw: bytes + newline; hex: lowercase hex per line; json: "
                        '{"index", "record"} per line (base64 for non-UTF-8) (default: raw)')
    c.add_argument("--verify", choices=("none", "headers", "all"), default="headers",
                   help="hash checks: header hashes (default), all data too, or none")
    c.set_defaults(func=cmd_cat)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ArrayRecordFormatError, StorageError, OSError) as err:
        print(f"aioloader {args.command}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `aioloader cat x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
