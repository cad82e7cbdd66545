"""The `aioloader` command: inspect, print, convert and benchmark ArrayRecord data.

    aioloader inspect PATH...      what a file holds: records, chunks, codec, options
    aioloader cat PATH             print records (hex is a stable, script-friendly format)
                                   (a quoted glob: its files in sorted order, numbered across)
    aioloader convert IN... OUT    JSON lines / TFRecord / .npy / Parquet -> sharded files
                                   (existing output refused unless --overwrite); with
                                   `--runner beam [-- BEAM OPTIONS]` on Apache Beam
    aioloader bench URL            stream a dataset through a pipeline, report throughput

Paths are local files or any fsspec URL (gs://bucket/x.array_record with the `gcs` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from ..arrayrecord import DEFAULT_VERIFY, VERIFY_LEVELS, ArrayRecordFormatError
from ..errors import MissingExtraError
from ..io.storage import StorageError
from ..urls import redact
from .cli_cat import cmd_cat, open_one
from .cli_convert import cmd_convert
from .convert import ConvertError


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _describe(path: str) -> list[dict]:
    """One summary per file `path` names (a glob names several, in sorted order)."""
    with open_one(path) as src:
        return [_summary(url, index) for url, index in zip(src.urls, src.file_indices)]


def _summary(url: str, index: Any) -> dict:
    opts = index.options
    n = index.num_records
    decoded = int(index.chunk_decoded_sizes.sum())
    return {
        "path": redact(url),
        "file_size": index.size,
        "records": n,
        "chunks": index.num_chunks,
        "group_size": index.group_size,
        "compression": opts.compression.name if opts else "unknown",
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
    infos = [info for p in args.paths for info in _describe(p)]
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


# -- bench ----------------------------------------------------------------------------


def _text(record: bytes) -> int:
    return len(json.loads(record))


def _image(record: bytes) -> Any:
    import numpy as np

    return np.frombuffer(record, dtype=np.uint8)


def _raw(record: bytes) -> int:
    return len(record)


_PIPELINES = {"text": _text, "images": _image, "raw": _raw}


def cmd_bench(args: argparse.Namespace) -> int:
    import time

    from tqdm import tqdm

    from ..describe.dataset import Dataset

    ds = Dataset.from_arrayrecord(args.url).shuffle(args.seed)
    if args.seconds:
        ds = ds.repeat()
    ds = ds.map(_PIPELINES[args.pipeline]).batch(args.batch)
    loader = ds.loader(workers=args.workers, prefetch=args.prefetch,
                       io_concurrency=args.io_concurrency)
    bar = tqdm(unit=" rec", unit_scale=True, desc=f"bench {args.pipeline}",
               disable=args.quiet, dynamic_ncols=True)
    t0 = time.perf_counter()
    records = 0
    try:
        for batch in loader:
            n = len(batch)
            records += n
            bar.update(n)
            if bar.n % (20 * n) < n:
                io = loader.stats().io
                bar.set_postfix_str(f"{io.get('bytes', 0) / 1e6 / (time.perf_counter() - t0):,.0f}"
                                    " MB/s", refresh=False)
            if args.seconds and time.perf_counter() - t0 >= args.seconds:
                break
    finally:
        bar.close()
        loader.close()
    took = time.perf_counter() - t0
    stats = loader.stats()
    io = stats.io
    print(f"time to first batch  {stats.first_batch_seconds or 0:.3f} s")
    print(f"throughput           {records / took:,.0f} records/s, "
          f"{io.get('bytes', 0) / 1e6 / took:,.1f} MB/s read ({records:,} records, {took:.1f} s)")
    print()
    print(stats)
    return 0


def _version() -> str:
    """The installed distribution's version (what pip installed), else the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aioloader")
    except PackageNotFoundError:  # run from a source tree that was never installed
        package = sys.modules[__package__ or "aioloader"]
        return str(getattr(package, "__version__", "unknown"))


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand each, its arguments added by its own function."""
    p = argparse.ArgumentParser(
        prog="aioloader",
        description="Look inside ArrayRecord files, local or in a bucket (gs://...).",
    )
    p.add_argument("--version", action="version", version=f"aioloader {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_inspect, _add_cat, _add_convert, _add_bench):
        add(sub)
    return p


def _add_inspect(sub: Any) -> None:
    s = sub.add_parser("inspect", help="summarise files: records, chunks, codec, options",
                       description="Summarise ArrayRecord files: records, chunks, group "
                                   "size, codec, the stored writer options, bytes per record.")
    s.add_argument("paths", nargs="+", metavar="PATH",
                   help="local path or fsspec URL, or a quoted glob (every file it matches)")
    s.add_argument("--json", action="store_true", help="print JSON for machines")
    s.set_defaults(func=cmd_inspect)


def _add_cat(sub: Any) -> None:
    c = sub.add_parser(
        "cat", help="print records",
        description="Print records in file order. '--format hex' is a stable contract for "
                    "scripts: one record per line, lowercase hex, an empty line for an empty "
                    "record.",
    )
    c.add_argument("path", metavar="PATH",
                   help="local path or fsspec URL, or a quoted glob (records numbered across "
                        "its files, in sorted order)")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--index", type=int, help="print only record INDEX (negative counts "
                                                 "from the end)")
    which.add_argument("--range", metavar="START:STOP",
                       help="print records START..STOP-1 (either may be omitted or negative)")
    c.add_argument("--format", choices=("raw", "hex", "json"), default="raw",
                   help="raw: bytes + newline; hex: lowercase hex per line; json: "
                        '{"index", "record"} per line (base64 for non-UTF-8) (default: raw)')
    c.add_argument("--verify", choices=VERIFY_LEVELS, default=DEFAULT_VERIFY,
                   help="hash checks: all: every hash, chunk data included, as Google's reader "
                        "(default); headers: headers only (a flipped bit in a record is "
                        "not noticed); none")
    c.set_defaults(func=cmd_cat)


def _add_convert(sub: Any) -> None:
    v = sub.add_parser(
        "convert", help="convert JSON lines / TFRecord / .npy / Parquet to ArrayRecord",
        description="Convert record files to sharded ArrayRecord files named "
                    "OUTPUT_PREFIX-00000-of-0000N.array_record (local or any fsspec URL). "
                    "Records are dealt round-robin to the shards, which are written in "
                    "parallel. TFRecord is read without TensorFlow, checksums verified. "
                    "Shards are written under hidden temporary names and renamed into place "
                    "only when all succeeded; existing output is never touched unless "
                    "--overwrite is given.",
    )
    v.add_argument("inputs", nargs="+", metavar="INPUT", help="input files (local or URLs)")
    v.add_argument("output_prefix", metavar="OUTPUT_PREFIX",
                   help="e.g. gs://bucket/train or data/train")
    v.add_argument("--from", dest="input_format", choices=("jsonl", "tfrecord", "npy",
                                                            "parquet"),
                   help="input format (default: from the file names)")
    v.add_argument("--shards", type=int, default=None,
                   help="number of output files (default 1; with --runner beam, the runner "
                        "picks)")
    v.add_argument("--group-size", type=int, default=1,
                   help="records per chunk; keep 1 for shuffled training (default 1)")
    v.add_argument("--compression", default="zstd:3",
                   help="zstd[:level], brotli[:level], snappy or uncompressed (default zstd:3)")
    v.add_argument("--overwrite", action="store_true",
                   help="replace existing output files (default: refuse); they are replaced "
                        "only once the whole conversion succeeded")
    v.add_argument("--runner", choices=("local", "beam"), default="local",
                   help="local: threads in this process (default); beam: an Apache Beam "
                        "pipeline (the `beam` extra), on Beam's local runner or, with "
                        "pipeline options after `--`, on Dataflow, Flink or Spark")
    v.add_argument("--match-shards", action="store_true",
                   help="with --runner beam: one output shard per input file, in order")
    v.add_argument("--decode-examples", action="store_true",
                   help="TFRecord input holds tf.train.Examples: store each as typed named "
                        "fields (no TensorFlow needed), described by the first Example")
    v.add_argument("--features", metavar="DESC",
                   help="with --decode-examples, the fields to keep, e.g. 'image:bytes,"
                        "label:int64,emb:float32[128],tokens:int64[-1]' (-1: variable)")
    v.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=cmd_convert)


def _add_bench(sub: Any) -> None:
    b = sub.add_parser(
        "bench", help="stream a dataset through a pipeline and report throughput",
        description="Stream a dataset (shuffled) through a typical pipeline with a live "
                    "progress bar, then print the time to the first batch, the throughput "
                    "and the per-stage stats table.",
    )
    b.add_argument("url", metavar="URL", help="path, glob or URL, e.g. 'gs://b/train-*'")
    b.add_argument("--pipeline", choices=sorted(_PIPELINES), default="text",
                   help="text: json.loads; images: np.frombuffer; raw: no decode")
    b.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    b.add_argument("--workers", type=int, default=1, help="decode processes (default 1)")
    b.add_argument("--prefetch", type=int, default=8, help="batches in flight (default 8)")
    b.add_argument("--io-concurrency", type=int, default=64,
                   help="range reads in flight (default 64)")
    b.add_argument("--seconds", type=float, default=0,
                   help="run this long, repeating epochs (default: one epoch)")
    b.add_argument("--seed", type=int, default=0, help="shuffle seed")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=cmd_bench)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    beam_args: list[str] = []
    if argv[:1] == ["convert"] and "--" in argv:  # `convert ... -- BEAM PIPELINE OPTIONS`
        cut = argv.index("--")
        argv, beam_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    args.beam_args = beam_args
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BrokenPipeError:  # `aioloader inspect ... | head`: the reader has all it wanted
        _silence_stdout()
        return 0
    except (ArrayRecordFormatError, StorageError, ConvertError, OSError,
            MissingExtraError) as err:
        print(f"aioloader {args.command}: {redact(str(err))}", file=sys.stderr)
        return 1
    except Exception:  # unforeseen: the traceback, with no URL's credentials in it
        print(redact(traceback.format_exc()), file=sys.stderr, end="")
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit, finding the pipe
    closed, prints no "Exception ignored ... BrokenPipeError" (Python's documented idiom)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

if __name__ == "__main__":
    sys.exit(main())
