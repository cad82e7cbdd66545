"""`aioloader convert`: JSON lines / TFRecord / .npy / Parquet into sharded ArrayRecord files,
on this machine (with a progress bar) or on Apache Beam (`--runner beam`). The argument
parser is `aioloader.tools.cli`'s; this is what the command does with what it parsed.
"""

from __future__ import annotations

import argparse

from ..errors import MissingExtraError
from ..urls import redact
from .cli_common import Progress
from .convert import ConvertError, check_output_prefix

__all__ = ["cmd_convert"]


def _convert_on_beam(args: argparse.Namespace) -> int:
    import fsspec

    try:
        from ..beam.pipelines import run_convert
    except MissingExtraError:
        raise
    except ImportError as exc:  # apache_beam there, but something it needs is not
        raise MissingExtraError("beam", "--runner beam", exc.name) from None
    if args.decode_examples:
        raise ConvertError("--decode-examples runs with --runner local only (for now)")
    if not args.overwrite:
        fs, path = fsspec.core.url_to_fs(args.output_prefix, **args.storage_options)
        existing = fs.glob(f"{path}-?????-of-?????.array_record")
        if existing:
            raise FileExistsError(f"output already exists: {redact(args.output_prefix)}-*-of-*"
                                  f" ({len(existing)} files); pass --overwrite to replace it")
    out = run_convert(args.inputs, args.output_prefix, args.beam_args, fmt=args.input_format,
                      num_shards=0 if args.shards is None else args.shards,
                      match_shards=args.match_shards,
                      group_size=args.group_size, compression=args.compression,
                      storage_options=args.storage_options or None)
    shards = f"{out['shards']:05d}" if out["shards"] else "*"
    records = "" if out["records"] is None else f"{out['records']:,} records "
    print(f"wrote {records}to {redact(args.output_prefix)}-*-of-{shards}.array_record")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    check_output_prefix(args.output_prefix)
    if args.runner == "beam":
        return _convert_on_beam(args)
    if args.match_shards or args.beam_args:
        raise ConvertError("--match-shards and Beam pipeline options need --runner beam")
    if args.features and not args.decode_examples:
        raise ConvertError("--features describes Examples: it goes with --decode-examples")
    from .convert import convert

    bar = Progress("converting", quiet=args.quiet)  # (on a terminal, from the first records)

    def progress(records: int, size: int) -> None:
        bar.update(records, f"{size / 1e6:,.1f} MB")

    ok = False
    try:
        out = convert(args.inputs, args.output_prefix, fmt=args.input_format,
                      shards=1 if args.shards is None else args.shards, group_size=args.group_size,
                      compression=args.compression, progress=progress,
                      overwrite=args.overwrite,
                      decode_examples=args.features or args.decode_examples,
                      storage_options=args.storage_options)
        ok = True
    finally:
        bar.close(ok)  # a failed run's bar is cleared: the error stands alone
    print(f"wrote {out['records']:,} records ({out['bytes'] / 1e6:,.1f} MB) to "
          f"{len(out['outputs'])} files: {redact(out['outputs'][0])}"
          + (" ..." if len(out["outputs"]) > 1 else ""))
    if out["element_spec"] is not None:
        print(f"element spec: {out['element_spec']} (read with decode='auto')")
    return 0
