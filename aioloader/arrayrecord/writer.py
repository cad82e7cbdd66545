"""`ArrayRecordWriter`: files that Google's array_record and Grain read back unchanged.

Records are grouped into chunks of exactly `group_size` (the official reader infers the
group size from the first chunk, so groups must be uniform), each chunk is laid out with its
block headers, and `close()` appends the footer index and the postscript. The output for
`uncompressed` is byte-identical to the official writer's. See ARRAYRECORD_FORMAT.md §10.
"""

from __future__ import annotations

import os
from typing import IO, Any

from .chunk import encode_simple
from .codecs import Compression
from .hashing import highwayhash64
from .layout import CHUNK_SIMPLE, ChunkHeader, padding_chunk, physical_pieces
from .options import WriterOptions, parse_options
from .proto import ELEMENT_SPEC_FIELD, encode_footer_entry, encode_metadata, encode_postscript

SIGNATURE = bytes.fromhex(
    "83af70d10d884a3f00000000000000004000000000000000"
    "91bac23c9287e1a90000000000000000e19f13c0e9b1c372"
    "73000000000000000000000000000000"
)


_JOIN_BELOW = 1 << 20  # chunks smaller than this are joined into one write


def _open(target: str | os.PathLike | IO[bytes],
          storage_options: dict[str, Any] | None) -> tuple[IO[bytes], bool]:
    if hasattr(target, "write"):
        if storage_options:
            raise ValueError("storage_options apply to a URL, not to a file object")
        return target, False  # type: ignore[return-value]
    path = os.fspath(target)
    if "://" in path and not path.startswith("file://"):
        import fsspec  # any fsspec URL (gs://, s3://, memory://, ...)

        return fsspec.open(path, "wb", **(storage_options or {})).open(), True
    return open(path.removeprefix("file://"), "wb"), True


class ArrayRecordWriter:
    """Write records to an ArrayRecord file (a path, any fsspec URL, or a binary file object).

    `compression` is `"zstd[:level]"`, `"brotli[:level]"`, `"snappy"` or `"uncompressed"`,
    optionally followed by `,window_log:N`; `options` takes a full array_record options string
    instead (e.g. `"group_size:1,zstd:3"`). `storage_options` go to the fsspec filesystem of
    a URL target (credentials, `requester_pays`, `endpoint_url`, ...), as the readers take them.

    `element_spec` (an `aioloader.ElementSpec`, or its JSON) records what each record holds in
    the file's footer metadata, for `Dataset.from_arrayrecord(..., decode="auto")`; with one,
    `write()` also takes the elements themselves (arrays, dicts of arrays) and encodes them.
    It may be set until `close()` (the footer is written last).
    """

    def __init__(
        self,
        target: str | os.PathLike | IO[bytes],
        group_size: int = 1,
        compression: str = "zstd:3",
        pad_to_block_boundary: bool = False,
        *,
        options: str | None = None,
        storage_options: dict[str, Any] | None = None,
        element_spec: Any = None,
    ) -> None:
        if options is None:
            options = f"group_size:{group_size},{compression}"
            if pad_to_block_boundary:
                options += ",pad_to_block_boundary:true"
        parsed = parse_options(options)
        if parsed.transpose:
            raise ValueError("transpose is not supported by aioloader's writer")
        self.options: WriterOptions = WriterOptions(
            group_size=parsed.group_size,
            compression=parsed.compression,
            pad_to_block_boundary=parsed.pad_to_block_boundary,
            max_parallelism=1,
        )
        self._compression: Compression = parsed.compression
        self._file, self._owns_file = _open(target, storage_options)
        self._name = getattr(target, "name", None) if hasattr(target, "write") else str(target)
        self._group: list[bytes] = []
        self._chunks: list[bytes] = []  # encoded footer entries
        self._num_records = 0
        self._pos = 0
        self._closed = False
        self.element_spec = element_spec
        self._emit(SIGNATURE)

    # -- public -------------------------------------------------------------------------

    def write(self, record: Any) -> None:
        """Append one record: bytes, or an element that `element_spec` encodes."""
        if self._closed:
            raise ValueError(f"{self._name}: write() on a closed ArrayRecordWriter")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            encode = getattr(self.element_spec, "encode", None)
            if encode is None:
                raise TypeError(f"{self._name}: write() takes bytes (or, with an element_spec,"
                                f" an element), got {type(record).__name__}")
            record = encode(record)
        self._group.append(bytes(record))
        if len(self._group) == self.options.group_size:
            self._flush_group()

    def close(self) -> None:
        """Write the last chunk, the footer and the postscript; close what we opened."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._group:
                self._flush_group()
            self._write_index()
        finally:
            if self._owns_file:
                self._file.close()

    def __enter__(self) -> ArrayRecordWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def num_records(self) -> int:
        return self._num_records

    # -- internals ----------------------------------------------------------------------

    def _emit(self, raw: bytes) -> None:
        self._file.write(raw)
        self._pos += len(raw)

    def _emit_chunk(self, data: bytes, num_records: int, decoded: int) -> int:
        """Write a simple chunk holding `data`; return where it begins."""
        begin = self._pos
        header = ChunkHeader(len(data), highwayhash64(data), CHUNK_SIMPLE, num_records, decoded)
        # Large chunks go out piece by piece (views of `data`, block headers in between), so
        # the data is not copied again; for small ones one copy costs less than a few writes.
        pieces = physical_pieces(begin, (header.pack(), data), num_records)
        if len(data) < _JOIN_BELOW:
            self._emit(b"".join(pieces))
        else:
            for piece in pieces:
                self._emit(piece)
        return begin

    def _flush_group(self) -> None:
        records, self._group = self._group, []
        data, decoded = encode_simple(records, self._compression)
        begin = self._emit_chunk(data, len(records), decoded)
        self._chunks.append(encode_footer_entry(begin, decoded, len(records)))
        self._num_records += len(records)
        if self.options.pad_to_block_boundary:
            self._emit(padding_chunk(self._pos))

    def _write_index(self) -> None:
        spec = self.element_spec
        if spec is not None and not isinstance(spec, (str, bytes)):
            spec = spec.to_json()
        extra = {} if spec is None else {
            ELEMENT_SPEC_FIELD: spec.encode() if isinstance(spec, str) else spec}
        footer_records = [
            encode_metadata(len(self._chunks), self._num_records, self.options.to_string(),
                            extra),
            *self._chunks,
        ]
        data, decoded = encode_simple(footer_records, self._compression)
        footer_offset = self._pos
        self._emit_chunk(data, len(footer_records), decoded)
        self._emit(padding_chunk(self._pos))
        post = encode_postscript(footer_offset)
        data, decoded = encode_simple([post] * 3, Compression(0, None, None))
        self._emit_chunk(data, 3, decoded)
        self._emit(padding_chunk(self._pos))
