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
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from ..arrayrecord.errors import ArrayRecordFormatError
from ..arrayrecord.fileindex import FileIndex, compact_sizes, ones_like
from .bytesrecords import BytesRecords

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
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")

CORRUPT_HINT = ("the file is corrupted or was not fully written, or is not TFRecord; "
                "re-create or re-upload it")
COMPRESSED_HINT = ("a GZIP- or ZLIB-compressed TFRecord file has no random access: convert "
                   "it once with `aioloader convert --from tfrecord IN.gz OUT_PREFIX` (GZIP "
                   "files named *.gz; decompress a ZLIB file first), or decompress it")


class TFRecordFormatError(ArrayRecordFormatError):
    """Malformed, truncated or unsupported TFRecord data (an `ArrayRecordFormatError`, so
    every layer that handles a damaged file handles it; its "chunk" is the record)."""

    UNIT = "record"


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
    """The file's index, by one pass over its length headers (see the module's docstring).

    Each window is walked in a tight loop that only follows the lengths (each checked to fit
    in the file), then its headers' checksums are checked at once (`_crc32c_8`); a length
    that does not fit is reported as a bad checksum when its header's checksum fails, so a
    damaged header is named as such, not as the lie it tells."""
    # An empty file is a TFRecord file of no records (TensorFlow and Beam write empty
    # shards): the loop below finds none.
    window = max(window, 1 << 16)
    check = verify != "none"
    offsets: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    count = 0  # records found so far
    unpack = _U64.unpack_from
    base = 0  # the window's (and its first record's) offset
    while base < size:
        want = min(window, size - base)
        buf = yield (base, want)
        if len(buf) != want:
            raise TFRecordFormatError(
                f"short read: asked for {want} bytes, got {len(buf)}", path=path, offset=base,
                hint="the object changed or was truncated while reading; re-open it")
        view = buf if type(buf) is bytes else bytes(buf)
        ats: list[int] = []
        add = ats.append
        at, last, end = 0, want - HEADER, size - base
        lying = -1  # the place of a header whose length runs past the file's end
        while at <= last:
            nxt = at + OVERHEAD + unpack(view, at)[0]
            if nxt > end:
                lying = at
                break
            add(at)
            at = nxt
        heads = _heads(view, ats + ([lying] if lying >= 0 else []))
        if check and len(heads):
            bad = np.flatnonzero(_masked_crc_8(heads[:, :8]) !=
                                 heads[:, 8:].copy().view("<u4").ravel())
            if bad.size:
                k = int(bad[0])
                where = base + (ats[k] if k < len(ats) else lying)
                raise TFRecordFormatError(
                    "the length's checksum does not match", path=path, offset=where,
                    chunk=count + k, hint=COMPRESSED_HINT if where == 0 else CORRUPT_HINT)
        if lying >= 0:
            length = int(heads[-1, :8].copy().view("<u8")[0])
            left = end - lying - OVERHEAD
            raise TFRecordFormatError(
                f"the record declares {length:,} bytes, but the file has {max(left, 0):,} "
                "left for it", path=path, offset=base + lying, chunk=count + len(ats),
                hint=CORRUPT_HINT)
        if ats:
            offsets.append(np.asarray(ats, dtype=np.int64) + base)
            lengths.append(heads[:, :8].copy().view("<u8").ravel().astype(np.int64))
            count += len(ats)
        if at < end and at + HEADER > end:
            raise TFRecordFormatError(
                f"truncated record header: {end - at} bytes left of the {HEADER} a header "
                "takes", path=path, offset=base + at, chunk=count, hint=CORRUPT_HINT)
        base += at  # the next window starts at the next record (past any it skipped)
    bounds = np.empty(count + 1, dtype=np.int64)
    if count:
        np.concatenate(offsets, out=bounds[:count])
    bounds[count] = size
    sizes = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return FileIndex(path=path, size=size, footer_offset=size, chunk_offsets=bounds[:count],
                     chunk_records=ones_like(sizes), chunk_decoded_sizes=compact_sizes(sizes),
                     writer_options="")


def _heads(view: bytes, ats: list[int]) -> np.ndarray:
    """The HEADER bytes at each of `ats` in `view`, one row each."""
    if not ats:
        return np.zeros((0, HEADER), dtype=np.uint8)
    data = np.frombuffer(view, dtype=np.uint8)
    return data[np.asarray(ats, dtype=np.int64)[:, None] + _HEADER_COLS]


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_CRC_TABLE = _crc_table()  # CRC-32C (Castagnoli), reflected
_HEADER_COLS = np.arange(HEADER, dtype=np.int64)


def _masked_crc_8(rows: np.ndarray) -> np.ndarray:
    """`masked_crc` of each row of an (n, 8) uint8 array, all at once (table-driven: a
    few array operations for a window's thousands of headers, where one call each to the C
    implementation costs more than the walk)."""
    crc = np.full(len(rows), 0xFFFFFFFF, dtype=np.uint32)
    for j in range(rows.shape[1]):
        crc = _CRC_TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


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


class TFRecordFormat(BytesRecords):
    """TFRecord files: framed records, no index (one is built by a scan)."""

    name = "tfrecord"
    contextual = False
    stashable = False
    stash_from = 1 << 20  # (not stashable: a chunk holds one record)
    stash_shared = False

    def open_index(self, size: int, *, path: str | None, verify: str, max_decoded: int,
                   local: bool, span: int | None = None) -> IndexSteps:
        window = WINDOW_LOCAL if local else WINDOW_REMOTE
        return scan(size, path=path, verify=verify, window=min(window, max_decoded // 4))

    def decode_records(self, raws: Sequence, starts: Sequence[int], within: Sequence[int], *,
                       verify: str, paths: Sequence[str | None] | None,
                       chunks: Sequence[int | None] | None, counts: Sequence[int] | None,
                       max_decoded: int, states: Sequence[Any] | None = None) -> list[bytes]:
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
                     max_decoded: int, state: Any = None) -> ChunkRecords:
        from ..arrayrecord.chunk import ChunkRecords  # (loads the codecs: only when read)

        data = payload(raw, start, verify=verify, path=path, chunk=chunk)
        return ChunkRecords._one(memoryview(data), data)

    def stash_records(self, raw, start: int, wanted: Sequence[int], *, verify: str,
                      path: str | None, chunk: int | None, expected_records: int | None,
                      max_decoded: int, state: Any = None
                      ) -> tuple[bytes, Iterable[bytes]]:
        raise TypeError(f"{self.name} records do not go through the stash")

    def index_limits(self, size: int) -> tuple[int, int]:
        return 0, size  # records from byte 0; the index ends at the file's end

    def proof_offset(self, index: FileIndex) -> int:
        return max(0, index.size - 64)  # the last record's tail and payload checksum

    def check_cached(self, index: FileIndex) -> None:
        """(no context: the cache's own checks are all there is)"""

    def codec(self, index: FileIndex) -> str:
        return "none"


FORMAT = TFRecordFormat()
