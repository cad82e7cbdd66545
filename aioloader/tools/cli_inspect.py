"""`aioloader inspect`: what ArrayRecord (or TFRecord) files hold (records, chunks, codec,
the stored writer options, bytes per record), as a table or JSON. The argument parser is
`aioloader.tools.cli`'s; this is what the command does with what it parsed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..formats import ARRAYRECORD, get
from ..urls import redact
from .cli_cat import open_one

__all__ = ["cmd_inspect"]


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _describe(path: str, options: dict[str, Any], kind: str | None = None) -> list[dict]:
    """One summary per file `path` names (a glob names several, in sorted order)."""
    with open_one(path, storage_options=options, record_format=kind) as src:
        return [_summary(url, index, k) for url, index, k in
                zip(src.urls, src.file_indices, src.table.formats)]


def _summary(url: str, index: Any, kind: str) -> dict:
    opts = index.options
    n = index.num_records
    decoded = int(index.chunk_decoded_sizes.sum())
    return {
        "path": redact(url),
        "format": kind,
        "file_size": index.size,
        "records": n,
        "chunks": index.num_chunks,
        "group_size": index.group_size,
        "compression": opts.compression.name if opts else get(kind).codec(index),
        "compression_level": opts.compression.level if opts else None,
        "window_log": opts.compression.window_log if opts else None,
        "transpose": opts.transpose if opts else None,
        "options": index.writer_options,
        "element_spec": index.element_spec or None,
        "decoded_bytes": decoded,
        "bytes_per_record": round(index.size / n, 2) if n else None,
        "decoded_bytes_per_record": round(decoded / n, 2) if n else None,
        "footer_offset": index.footer_offset,
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    options = args.storage_options
    kind = getattr(args, "record_format", None)
    infos = [info for p in args.paths for info in _describe(p, options, kind)]
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
            ("format", info["format"]),
            ("file size", f"{_human(info['file_size'])} ({info['file_size']:,} bytes)"),
            ("records", f"{info['records']:,}"),
            ("chunks", f"{info['chunks']:,}"),
            ("group size", f"{info['group_size']:,}"),
            ("compression", codec),
        ]
        if info["format"] == ARRAYRECORD:  # (other formats store no writer options)
            rows.append(("options", info["options"] or "(none stored: written before 2022)"))
        if info["element_spec"]:
            rows.append(("element spec", info["element_spec"]))
        if info["records"]:
            rows += [
                ("bytes/record", f"{info['bytes_per_record']:,} on disk, "
                                 f"{info['decoded_bytes_per_record']:,} decoded"),
            ]
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
        if info["transpose"]:
            print("note: written with transpose (transposed chunks); aioloader reads them, "
                  "more slowly than simple chunks, and does not write them")
    return 0
