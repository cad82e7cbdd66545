"""TFRecord as a `RecordFormat`: each record is its own chunk, found by one scan of the file.

A TFRecord file is a sequence of `u64 length, u32 masked crc32c(length), payload, u32 masked
crc32c(payload)` (little-endian) with no index, so opening a file reads it once, start to
end, in windows (`WINDOW_LOCAL` / `WINDOW_REMOTE` bytes a read), following the length
headers: each length's checksum is checked (unless verify="none") and so is that it fits in
what is left of the file, before the scan moves past it, so a lying length is an error
naming the file, the record and its byte offset, never a huge allocation or a hang. A
record that runs past a window is skipped, not read (the next read starts after it). The
scan's table (record offsets, ending with the file's size; payload lengths as decoded
sizes) is the same `FileIndex` a group_size-1 ArrayRecord file has, and goes into the
index cache like one (`cache.index_cache`), so each version of a file is scanned once.

Record i's range is `[offset, offset + 12 + length + 4)`: decoding checks that its header
still declares that length (and its checksum, unless verify="none") and, with verify="all",
the payload's checksum, then returns the payload.

GZIP/ZLIB-compressed TFRecord has no random access (a record's offset means nothing in the
compressed stream): it is refused when asked for (`check_compression`), and a file that
does not parse as TFRecord says to convert it (`aioloader convert --from tfrecord`).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

import google_crc32c
import numpy as np

from ..arrayrecord.errors import ArrayRecordFormatError
from ..arrayrecord.fileindex import FileIndex, compact_sizes, ones_like

if TYPE_CHECKING:
    from ..arrayrecord.chunk import ChunkRecords
    from .base import IndexSteps

HEADER = 12  # u64 length, u32 masked crc32c of it
FOOTER = 4  # u32 masked crc32c of the payload
OVERHEAD = HEADER + FOOTER
WINDOW_LOCAL = 4 << 20  # bytes a scan reads at once from a local file
WINDOW_REMOTE = 16 << 20  # ... and from a bucket (a request each: sequential, one at a time)
_MASK_DELTA = 0xA282EAD8
_HEAD = struct.Struct("<QI")
_U32 = struct.Struct("<I")

CORRUPT_HINT = ("the file is corrupted or was not fully written, or is not TFRecord; "
                "re-create or re-upload it")
COMPRESSED_HINT = ("a GZIP- or ZLIB-compressed TFRecord file has no random access: convert "
                   "it once with `aioloader convert --from tfrecord IN OUT`")


class TFRecordFormatError(ArrayRecordFormatError):
    """Malformed, truncated or unsupported TFRecord data (an `ArrayRecordFormatError`, so
    every layer that handles a damaged file handles it; its "chunk" is the record)."""

    def _render(self) -> str:
        where = [str(self.path)] if self.path is not None else []
        if self.chunk is not None:
            where.append(f"record {self.chunk}")
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        text = f"{', '.join(where)}: {self.what}" if where else self.what
        return f"{text} ({self.hint})" if self.hint else text

    def located(self, *, path: str | None = None,
                chunk: int | None = None) -> TFRecordFormatError:
        return TFRecordFormatError(self.what, path=self.path if self.path is not None else path,
                                   offset=self.offset,
                                   chunk=self.chunk if self.chunk is not None else chunk,
                                   hint=self.hint)

    def __reduce__(self):  # keep the type and the fields across process boundaries
        return (_rebuild, (self.what, self.path, self.offset, self.chunk, self.hint))


def _rebuild(what, path, offset, chunk, hint) -> TFRecordFormatError:
    return TFRecordFormatError(what, path=path, offset=offset, chunk=chunk, hint=hint)


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of `data` (`bytes`: Google's C implementation takes no
    other buffer)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """`record` framed as TFRecord stores it (for writers of test files and fixtures)."""
    head = struct.pack("<Q", len(record))
    return head + _U32.pack(masked_crc(head)) + record + _U32.pack(masked_crc(record))


def check_compression(compression: str | None) -> None:
    """Refuse what cannot be read by offset: any compression but none."""
    if compression is None or str(compression).upper() in ("", "NONE", "UNCOMPRESSED"):
        return
    if str(compression).upper() in ("GZIP", "ZLIB", "AUTO"):
        raise ValueError(f"from_tfrecord(compression={compression!r}): {COMPRESSED_HINT}")
    raise ValueError(f"from_tfrecord(compression={compression!r}): unknown compression "
                     "(None, 'GZIP' or 'ZLIB'; only None can be read by the loader)")


def scan(size: int, *, path: str | None, verify: str, window: int) -> IndexSteps:
    """The file's index, by one pass over its length headers (see the module's docstring)."""
    if size <= 0:
        raise TFRecordFormatError(
            "the file is empty (0 bytes): it holds no TFRecord record", path=path,
            hint="leave it out of the paths, or re-create it if it should hold records")
    window = max(window, 1 << 16)
    check = verify != "none"
    offsets = array("q")
    lengths = array("q")
    add_offset, add_length = offsets.append, lengths.append
    unpack = _HEAD.unpack_from
    pos = 0  # the next record's offset
    while pos < size:
        want = min(window, size - pos)
        buf = yield (pos, want)
        if len(buf) != want:
            raise TFRecordFormatError(
                f"short read: asked for {want} bytes, got {len(buf)}", path=path, offset=pos,
                hint="the object changed or was truncated while reading; re-open it")
        view = buf if type(buf) is bytes else bytes(buf)
        at = 0  # pos's place in buf
        while pos < size:
            if at + HEADER > want:
                if pos + HEADER > size:
                    raise TFRecordFormatError(
                        f"truncated record header: {size - pos} bytes left of the {HEADER} "
                        "a header takes", path=path, offset=pos, chunk=len(offsets),
                        hint=CORRUPT_HINT)
                break  # the header runs past this window: the next one starts at it
            length, crc = unpack(view, at)
            if check and masked_crc(view[at : at + 8]) != crc:
                raise TFRecordFormatError(
                    "the length's checksum does not match", path=path, offset=pos,
                    chunk=len(offsets),
                    hint=COMPRESSED_HINT if pos == 0 else CORRUPT_HINT)
            left = size - pos - OVERHEAD
            if length > left:
                raise TFRecordFormatError(
                    f"the record declares {length:,} bytes, but the file has "
                    f"{max(left, 0):,} left for it", path=path, offset=pos, chunk=len(offsets),
                    hint=CORRUPT_HINT)
            add_offset(pos)
            add_length(length)
            pos += OVERHEAD + length
            at += OVERHEAD + length
    n = len(offsets)
    bounds = np.empty(n + 1, dtype=np.int64)
    bounds[:n] = np.frombuffer(offsets, dtype=np.int64) if n else 0
    bounds[n] = size
    sizes = np.frombuffer(lengths, dtype=np.int64).copy() if n else np.zeros(0, np.int64)
    return FileIndex(path=path, size=size, footer_offset=size, chunk_offsets=bounds[:n],
                     chunk_records=ones_like(sizes), chunk_decoded_sizes=compact_sizes(sizes),
                     writer_options="")


def payload(raw, start: int, *, verify: str, path: str | None, chunk: int | None) -> bytes:
    """The payload of the record whose whole range `raw` (file offset `start`) holds."""
    n = len(raw)
    if n < OVERHEAD:
        raise TFRecordFormatError(f"a record's range of {n} bytes is shorter than its "
                                  f"{OVERHEAD}-byte framing", path=path, offset=start,
                                  chunk=chunk, hint=CORRUPT_HINT)
    view = memoryview(raw)
    length, crc = _HEAD.unpack_from(view, 0)
    head = bytes(view[:8]) if verify != "none" else b""
    if length != n - OVERHEAD:
        raise TFRecordFormatError(
            f"the record declares {length:,} bytes where its index has {n - OVERHEAD:,} (the "
            "file changed after it was indexed?)", path=path, offset=start, chunk=chunk,
            hint=CORRUPT_HINT)
    if verify != "none" and masked_crc(head) != crc:
        raise TFRecordFormatError("the length's checksum does not match", path=path,
                                  offset=start, chunk=chunk, hint=CORRUPT_HINT)
    data = bytes(view[HEADER : HEADER + length])
    if verify == "all" and masked_crc(data) != _U32.unpack_from(view, HEADER + length)[0]:
        raise TFRecordFormatError("the payload's checksum does not match", path=path,
                                  offset=start, chunk=chunk, hint=CORRUPT_HINT)
    return data


class TFRecordFormat:
    """TFRecord files: framed records, no index (one is built by a scan)."""

    name = "tfrecord"

    def open_index(self, size: int, *, path: str | None, verify: str, max_decoded: int,
                   local: bool, span: int | None = None) -> IndexSteps:
        window = WINDOW_LOCAL if local else WINDOW_REMOTE
        return scan(size, path=path, verify=verify, window=min(window, max_decoded // 4))

    def decode_records(self, raws: Sequence, starts: Sequence[int], within: Sequence[int], *,
                       verify: str, paths: Sequence[str | None] | None,
                       chunks: Sequence[int | None] | None, counts: Sequence[int] | None,
                       max_decoded: int) -> list[bytes]:
        out = []
        for k, (raw, start, j) in enumerate(zip(raws, starts, within)):
            path = paths[k] if paths is not None else None
            chunk = chunks[k] if chunks is not None else None
            if j != 0:
                raise TFRecordFormatError(f"record {j} asked of a one-record chunk",
                                          path=path, offset=start, chunk=chunk)
            out.append(payload(raw, start, verify=verify, path=path, chunk=chunk))
        return out

    def decode_chunk(self, raw, start: int, *, verify: str, path: str | None,
                     chunk: int | None, expected_records: int | None,
                     max_decoded: int) -> ChunkRecords:
        from ..arrayrecord.chunk import ChunkRecords  # (loads the codecs: only when read)

        data = payload(raw, start, verify=verify, path=path, chunk=chunk)
        return ChunkRecords._one(memoryview(data), data)

    def index_limits(self, size: int) -> tuple[int, int]:
        return 0, size  # records from byte 0; the index ends at the file's end

    def proof_offset(self, index: FileIndex) -> int:
        return max(0, index.size - 64)  # the last record's tail and payload checksum

    def codec(self, index: FileIndex) -> str:
        return "none"


FORMAT = TFRecordFormat()
