"""The `aioloader` command: inspect, print, convert and benchmark ArrayRecord data.

    aioloader inspect PATH...      what a file holds: records, chunks, codec, options
    aioloader cat PATH             print records: raw bytes (nothing added), hex (a stable,
                                   script-friendly format), JSON lines, or one .npy array
                                   (a quoted glob: its files in sorted order, numbered across)
    aioloader convert IN... OUT    JSON lines / TFRecord / .npy / Parquet -> sharded files
                                   (existing output refused unless --overwrite); with
                                   `--runner beam [-- BEAM OPTIONS]` on Apache Beam
    aioloader bench URL            stream a dataset through a pipeline, report throughput

Paths are local files or any fsspec URL (gs://bucket/x.array_record with the `gcs` extra);
`--storage-option KEY=VALUE` (or `--storage-options FILE.json`) passes the filesystem its
options, whose values no message shows. Progress bars show only on a terminal. `--version`
and `--help` load none of the runtime: each command imports its own module when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from ..arrayrecord.levels import DEFAULT_VERIFY, VERIFY_LEVELS
from ..errors import (
    ArrayRecordFormatError,
    ConvertError,
    ElementSpecError,
    MissingExtraError,
    StorageError,
)

# Light modules only: `--version` and `--help` load none of the runtime; each command loads
# its own module when it runs (`_command`).
from ..formats import NAMES as RECORD_FORMATS
from ..urls import redact
from .cli_common import fix_negative_values, scrub, storage_options

_PIPELINES = ("images", "raw", "text")  # (cli_bench.PIPELINES, not imported for --help)


def _command(module: str, name: str) -> Any:
    """The function `name` of `aioloader.tools.<module>`, imported when the command runs."""
    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(f"{__package__}.{module}"), name)(args))
    return run


class _Version(argparse.Action):
    """`--version`, the version looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"aioloader {_version()}")
        parser.exit()


def _version() -> str:
    """The installed distribution's version (what pip installed), else the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aioloader")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from .. import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand each, its arguments added by its own function."""
    p = argparse.ArgumentParser(
        prog="aioloader",
        description="Look inside ArrayRecord files, local or in a bucket (gs://...).",
    )
    p.add_argument("--version", action=_Version, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_inspect, _add_cat, _add_convert, _add_bench):
        add(sub)
    return p


def _add_inspect(sub: Any) -> None:
    s = sub.add_parser("inspect", help="summarise files: records, chunks, codec, options",
                       description="Summarise ArrayRecord or TFRecord files: records, "
                                   "chunks, group size, codec, the stored writer options, "
                                   "bytes per record.")
    s.add_argument("paths", nargs="+", metavar="PATH",
                   help="local path or fsspec URL, or a quoted glob (every file it matches)")
    s.add_argument("--json", action="store_true", help="print JSON for machines")
    _add_record_format(s)
    _add_storage_options(s)
    s.set_defaults(func=_command("cli_inspect", "cmd_inspect"))


def _add_record_format(p: Any) -> None:
    p.add_argument("--from", dest="record_format", choices=RECORD_FORMATS,
                   help="the files' record format (default: by the name: tfrecord for "
                        "*.tfrecord, *.tfrecords and *.tfrecord-NNNNN-of-NNNNN, parquet for "
                        "*.parquet, *.parq and *.pq, else arrayrecord)")


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
                       help="print records START..STOP-1 (either may be omitted or negative: "
                            "--range -2: is the last two)")
    c.add_argument("--format", choices=("raw", "hex", "json", "npy"), default="raw",
                   help="raw: the records' bytes, nothing added (see --separator); hex: "
                        "lowercase hex, one record a line; json: {\"index\", \"record\"} a line "
                        "(base64 for non-UTF-8); npy: one .npy array, a row per record, as "
                        "`convert` reads it: typed records (an element spec) as their dtype "
                        "and shape, untyped ones as uint8 rows; records of different lengths "
                        "(or of named fields) are refused, nothing written (default: raw)")
    c.add_argument("--separator", metavar="SEP",
                   help="bytes written after each record, with escapes \\n \\t \\r \\0 \\\\ "
                        "\\xHH (default: none for raw, \\n for hex and json; npy takes none)")
    c.add_argument("--verify", choices=VERIFY_LEVELS, default=DEFAULT_VERIFY,
                   help="hash checks: all: every hash, chunk data included, as Google's reader "
                        "(default); headers: headers only (a flipped bit in a record is "
                        "not noticed); none")
    _add_record_format(c)
    _add_storage_options(c)
    c.set_defaults(func=_command("cli_cat", "cmd_cat"))


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
    v.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (there is one only when stderr is a terminal)")
    _add_storage_options(v)
    v.set_defaults(func=_command("cli_convert", "cmd_convert"))


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
    b.add_argument("--report", metavar="FILE.html",
                   help="also write the run's report to FILE.html: plots over time (batches/s, "
                        "the wait, each stage's busy share, reads in flight, cache hits, "
                        "retries) and the stats table, one page that opens with no network")
    b.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (there is one only when stderr is a terminal)")
    _add_storage_options(b)
    b.set_defaults(func=_command("cli_bench", "cmd_bench"))


def _add_storage_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "storage options",
        "passed to the filesystem (fsspec; gcsfs for gs://) as its storage_options, for "
        "every path the command opens; values are never printed. A local GCS emulator is "
        "reached with STORAGE_EMULATOR_HOST=http://host:port in the environment, or "
        "--storage-option endpoint_url=http://host:port --storage-option token=anon.")
    group.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                       help="one option (repeatable); VALUE is read as JSON where it is JSON "
                            "(true, 30, \"quoted text\"), else as text: e.g. token=anon, "
                            "project=my-project, requester_pays=true")
    group.add_argument("--storage-options", dest="storage_options_file", metavar="FILE.json",
                       help="options from a JSON object in FILE (--storage-option wins)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    beam_args: list[str] = []
    if argv[:1] == ["convert"] and "--" in argv:  # `convert ... -- BEAM PIPELINE OPTIONS`
        cut = argv.index("--")
        argv, beam_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(fix_negative_values(argv))
    args.beam_args = beam_args
    options: dict[str, Any] = {}
    try:
        options = args.storage_options = storage_options(args)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BrokenPipeError:  # `aioloader inspect ... | head`: the reader has all it wanted
        _silence_stdout()
        return 0
    except (ArrayRecordFormatError, StorageError, ConvertError, OSError,
            MissingExtraError, ElementSpecError, argparse.ArgumentTypeError) as err:
        print(f"aioloader {args.command}: {scrub(redact(str(err)), options)}", file=sys.stderr)
        return 1
    except Exception:  # unforeseen: the traceback, with no URL's nor option's credentials
        print(scrub(redact(traceback.format_exc()), options), file=sys.stderr, end="")
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit, finding the pipe
    closed, prints no "Exception ignored ... BrokenPipeError" (Python's documented idiom)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

if __name__ == "__main__":
    sys.exit(main())
