"""The user-facing sources of the other record formats: `ArrayRecordSource`'s API and
options over TFRecord files (`TFRecordSource`) and Parquet files (`ParquetSource`); each
only fixes the format its files are read as (`aioloader.formats`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .. import formats as fmts
from .api import ArrayRecordSource


class TFRecordSource(ArrayRecordSource):
    """Random access to the records of one or more TFRecord files: `ArrayRecordSource`'s API
    and options over files that have no index of their own.

    Opening scans each file once (`aioloader.formats.tfrecord`): a sequential read of all of
    it, checking every length header; with `index_cache_dir` the scan is kept for that
    version of the file. Each record is then read by its own byte range, as a group_size-1
    ArrayRecord file's. `verify` ("all"): "all" checks each record's payload checksum too,
    "headers" only the length headers, "none" neither. `compression` must be None: a
    GZIP/ZLIB-compressed file has no random access (convert it with `aioloader convert`).
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike], *,
                 compression: str | None = None, **kw: Any) -> None:
        from ..formats.tfrecord import check_compression

        check_compression(compression)
        if kw.setdefault("format", "tfrecord") != "tfrecord":
            raise ValueError("TFRecordSource reads TFRecord files (format='tfrecord')")
        super().__init__(paths, **kw)


class ParquetSource(ArrayRecordSource):
    """Random access to the rows of one or more Parquet files: `ArrayRecordSource`'s API
    and options (`len`, `src[i]`, `src[[i, j]]`, `await src.read(...)`, globs, lists,
    `path[a:b]` read instructions, any fsspec URL) where a record is a row: a dict of
    column name -> value, as `aioloader.formats.parquet.rows` describes.

    `columns` (None: all) are the top-level columns read; only their column chunks are
    decoded. A row group is a chunk: opening reads each file's footer (one tail read, a
    second only for a long footer; kept by `index_cache_dir`, per column selection), and a
    row group is fetched and decoded once for all its rows that are asked for (decoded row
    groups are kept, bounded by `cache_bytes`). Malformed or lying files raise
    `ParquetFormatError` naming the file, row group and column.
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike], *,
                 columns: Sequence[str] | None = None, **kw: Any) -> None:
        kind = fmts.reading("parquet", None if columns is None else list(columns))
        if kw.setdefault("format", kind) != kind:
            raise ValueError("ParquetSource reads Parquet files (format='parquet'; "
                             "name the columns with columns=)")
        super().__init__(paths, **kw)
