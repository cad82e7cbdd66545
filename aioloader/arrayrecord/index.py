"""Open an ArrayRecord file from byte ranges: postscript, footer, and the chunk index.

Opening is written sans-I/O: `open_index` is a generator that yields `(offset, length)` read
requests and receives the bytes, so the same parser serves a local pread, a blocking fsspec
file and an asyncio range reader (see `read_index` for the synchronous driver). A speculative
tail read covers postscript and footer in one round trip for typical files; a second read is
issued only when the footer starts before the tail.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import cast

import numpy as np

from .chunk import (
    DEFAULT_MAX_DECODED,
    RECORD_COST,
    ChunkRecords,
    decode_simple,
    verify_data,
)
from .codecs import _local, _zstd_decompressor
from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .footer import FooterData, decode_footer_data
from .layout import (
    BLOCK_HEADER_SIZE,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    CHUNK_PADDING,
    CHUNK_TRANSPOSED,
    ChunkHeader,
    _parse_chunk_header,
    check_block_header,
    chunk_end,
    padding_length,
    strip_block_headers,
)
from .onerecord import headers_in, one_record, strip_into
from .options import WriterOptions, parse_options
from .proto import ELEMENT_SPEC_FIELD, POSTSCRIPT_MAGIC, parse_fields
from .transposed import decode_transposed

DEFAULT_TAIL = 1 << 18  # 256 KiB: postscript + footers of files up to ~50k chunks
POSTSCRIPT_MAX_DECODED = 1 << 16
VERIFY_LEVELS = ("none", "headers", "all")
MIN_FILE_SIZE = 2 * BLOCK_SIZE

ReadRequest = tuple[int, int]


def _check_verify(verify: str) -> None:
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")


@dataclass(frozen=True, eq=False)
class FileIndex:
    """Where every chunk of one file is, and how many records each holds.

    Kept lean, since millions of chunks are common (group_size 1): an all-ones
    `chunk_records` is a read-only broadcast (no memory per chunk; see `compact_counts`),
    decoded sizes are uint32 when they fit, and `chunk_ends` / `record_starts` are derived
    on first use. The source's `RecordTable` rebinds `chunk_offsets` and `chunk_ends` as views
    of its one table of every file's chunk boundaries (`with_bounds`), so nothing is kept twice.
    """

    path: str | None
    size: int
    footer_offset: int
    chunk_offsets: np.ndarray  # int64, one per data chunk
    chunk_records: np.ndarray  # int64 (a broadcast when every chunk holds one record)
    chunk_decoded_sizes: np.ndarray  # int64 or uint32
    writer_options: str
    element_spec: str = ""  # aioloader's element spec (JSON), if the writer recorded one

    @cached_property
    def chunk_ends(self) -> np.ndarray:
        """Physical end of each chunk's range (the next chunk, or the footer)."""
        return np.append(self.chunk_offsets[1:], self.footer_offset).astype(np.int64)

    @cached_property
    def record_starts(self) -> np.ndarray:
        """First record of each chunk, plus the total at the end."""
        out = np.zeros(len(self.chunk_records) + 1, dtype=np.int64)
        np.cumsum(self.chunk_records, out=out[1:])
        return out

    @cached_property
    def num_records(self) -> int:
        return int(self.chunk_records.sum(dtype=np.int64)) if self.num_chunks else 0

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_offsets)

    @cached_property
    def max_records(self) -> int:
        """The most records one chunk holds (0 for a file without chunks)."""
        return int(self.chunk_records.max()) if self.num_chunks else 0

    @cached_property
    def one_record_chunks(self) -> bool:
        """Every chunk holds exactly one record (group_size 1): chunk c is record c."""
        return self.num_chunks == self.num_records and self.max_records <= 1

    def with_bounds(self, bounds: np.ndarray) -> FileIndex:
        """This index with `chunk_offsets` and `chunk_ends` as views of `bounds` (its chunk
        offsets followed by its footer offset, equal to its own)."""
        n = self.num_chunks
        if len(bounds) != n + 1 or bounds[n] != self.footer_offset or \
                not np.array_equal(bounds[:n], self.chunk_offsets):
            raise ValueError("bounds are not this index's chunk offsets and footer offset")
        out = FileIndex(self.path, self.size, self.footer_offset, bounds[:n],
                        self.chunk_records, self.chunk_decoded_sizes, self.writer_options,
                        self.element_spec)
        vars(out).update(chunk_ends=bounds[1:], num_records=self.num_records)
        return out

    @cached_property
    def options(self) -> WriterOptions | None:
        """Parsed writer options, or None for files written without them (before 2022)."""
        try:
            return parse_options(self.writer_options) if self.writer_options else None
        except ValueError:
            return None

    @property
    def group_size(self) -> int:
        if self.options is not None:
            return self.options.group_size
        return int(self.chunk_records[0]) if self.num_chunks else 1

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Map record indices to (chunk, index within chunk), vectorized."""
        idx = np.asarray(indices, dtype=np.int64)
        n = self.num_records
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"{self.path or 'file'}: record {bad} out of range [0, {n})")
        if self.one_record_chunks:
            return idx, np.zeros_like(idx)
        chunks = np.searchsorted(self.record_starts, idx, side="right") - 1
        return chunks, idx - self.record_starts[chunks]

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """The physical byte range `[start, end)` that holds chunk `chunk`."""
        return int(self.chunk_offsets[chunk]), int(self.chunk_ends[chunk])


_ONE = np.ones(1, dtype=np.int64)
_ONE.flags.writeable = False


def compact_counts(counts: np.ndarray) -> np.ndarray:
    """Record counts, as a read-only broadcast of 1 when every chunk holds one record."""
    if len(counts) and counts.strides != (0,) and counts.min() == 1 and counts.max() == 1:
        return np.ndarray(counts.shape, np.int64, _ONE, 0, (0,))
    return counts


def compact_sizes(sizes: np.ndarray) -> np.ndarray:
    """Decoded chunk sizes, as uint32 when they fit (half the memory)."""
    if len(sizes) and sizes.dtype != np.uint32 and sizes.min() >= 0 and sizes.max() < 1 << 32:
        return sizes.astype(np.uint32)
    return sizes


def open_index(
    size: int,
    *,
    path: str | None = None,
    verify: str = "headers",
    tail: int = DEFAULT_TAIL,
    max_decoded: int = DEFAULT_MAX_DECODED,
) -> Generator[ReadRequest, bytes | memoryview, FileIndex]:
    """Parse a file's index; yields read requests, returns a `FileIndex`.

    `max_decoded` bounds what the footer may take to read and decode (see `decode_chunk`).
    """
    _check_verify(verify)
    if size < MIN_FILE_SIZE or size % BLOCK_SIZE:
        what = (f"{size} bytes is too small for an ArrayRecord file (at least {MIN_FILE_SIZE})"
                if size < MIN_FILE_SIZE else
                f"size {size} is not a multiple of 64 KiB")
        raise ArrayRecordFormatError(
            what, path=path,
            hint="the file is truncated, still being written, or not an ArrayRecord file",
        )
    tail = max(BLOCK_SIZE, min(size, tail - tail % BLOCK_SIZE or BLOCK_SIZE))
    tail_start = size - tail
    tail_bytes = yield (tail_start, tail)
    _check_length(tail_bytes, tail, tail_start, path)
    post_at = size - BLOCK_SIZE
    with _locating(path, post_at):
        footer_offset = _parse_postscript(
            memoryview(tail_bytes)[post_at - tail_start :], post_at, verify, path
        )
    if footer_offset >= tail_start:
        footer_raw: bytes | memoryview = (
            memoryview(tail_bytes)[footer_offset - tail_start : post_at - tail_start])
    else:
        if post_at - footer_offset > max_decoded:
            raise ArrayRecordFormatError(
                f"the footer would span {post_at - footer_offset} bytes, more than the "
                f"memory budget of {max_decoded} bytes allows", path=path,
                offset=footer_offset, hint="the postscript is corrupted or crafted; if the "
                "file is genuine, raise the budget (the loader's memory_budget)",
            )
        footer_raw = yield (footer_offset, post_at - footer_offset)
        _check_length(footer_raw, post_at - footer_offset, footer_offset, path)
    with _locating(path, footer_offset):
        return _parse_footer(footer_raw, footer_offset, size, verify, path, max_decoded)


@contextmanager
def _locating(path: str | None, offset: int):
    """Fill in the file and offset on errors raised by location-blind helpers."""
    try:
        yield
    except ArrayRecordFormatError as err:
        if err.path is not None and err.offset is not None:
            raise
        raise ArrayRecordFormatError(
            err.what, path=err.path or path,
            offset=err.offset if err.offset is not None else offset,
            chunk=err.chunk, hint=err.hint or CORRUPT_HINT,
        ) from None


def read_index(
    size: int,
    fetch: Callable[[int, int], bytes],
    *,
    path: str | None = None,
    verify: str = "headers",
    tail: int = DEFAULT_TAIL,
    max_decoded: int = DEFAULT_MAX_DECODED,
) -> FileIndex:
    """Drive `open_index` with a blocking `fetch(offset, length) -> bytes`."""
    steps = open_index(size, path=path, verify=verify, tail=tail, max_decoded=max_decoded)
    try:
        request = next(steps)
        while True:
            request = steps.send(fetch(*request))
    except StopIteration as done:
        return done.value


def _check_length(buf, want: int, offset: int, path: str | None) -> None:
    if buf is None or len(buf) != want:
        got = 0 if buf is None else len(buf)
        raise ArrayRecordFormatError(
            f"short read: asked for {want} bytes, got {got}", path=path, offset=offset,
            hint="the object changed or was truncated while reading; re-open it",
        )


def decode_chunk(
    raw,
    start: int,
    *,
    verify: str = "headers",
    path: str | None = None,
    chunk: int | None = None,
    expected_records: int | None = None,
    max_records: int | None = None,
    max_decoded: int = DEFAULT_MAX_DECODED,
    whole_range: bool = False,
    decoder=decode_simple,
) -> tuple[ChunkHeader, ChunkRecords]:
    """Decode the first chunk in the physical bytes `raw`, which begin at file offset `start`.

    Trailing bytes (padding chunks, the next chunk) are ignored, unless `whole_range` says
    `raw` is the chunk's whole range (up to the next chunk the footer lists): then the chunk,
    and at most a padding chunk to the next block boundary, must fill it exactly, or the
    footer left a chunk out. With `expected_records` (the
    footer's count), a chunk whose header declares another number of records is an error;
    so is one declaring more than `max_records`, or more decoded bytes than `max_decoded`
    (a memory budget), all checked before anything is decompressed.
    """
    check_headers = verify != "none"
    try:
        logical = memoryview(raw)
        in_block = start % BLOCK_SIZE
        # Inline `strip_block_headers`' zero-copy case: the range lies inside one block.
        if in_block < BLOCK_HEADER_SIZE or in_block + len(logical) > BLOCK_SIZE:
            logical = strip_block_headers(logical, start, verify=check_headers, path=path)
        header = _parse_chunk_header(ChunkHeader, logical, check_headers, None, start)
        end = CHUNK_HEADER_SIZE + header.data_size
        if len(logical) < end:
            raise ArrayRecordFormatError(
                f"chunk data truncated: header says {header.data_size} bytes, range holds "
                f"{len(logical) - CHUNK_HEADER_SIZE}",
                offset=start, hint=CORRUPT_HINT,
            )
        if expected_records is not None and header.num_records != expected_records:
            raise ArrayRecordFormatError(
                f"chunk holds {header.num_records} records, the footer says "
                f"{expected_records}", offset=start, hint=CORRUPT_HINT,
            )
        if max_records is not None and header.num_records > max_records:
            raise ArrayRecordFormatError(
                f"chunk declares {header.num_records} records, more than the {max_records} "
                "its place in the file can hold", offset=start, hint=CORRUPT_HINT,
            )
        if whole_range:
            _check_fills(start, raw, header)
        data = logical[CHUNK_HEADER_SIZE:end]
        if verify == "all":
            verify_data(header, data)
        if header.chunk_type == CHUNK_TRANSPOSED and decoder is decode_simple:
            return header, decode_transposed(header, data, max_decoded)
        return header, decoder(header, data, max_decoded)
    except ArrayRecordFormatError as err:
        if err.offset is None:
            err = ArrayRecordFormatError(err.what, path=err.path, offset=start,
                                         chunk=err.chunk, hint=err.hint)
        raise err.located(path=path, chunk=chunk) from None


def _check_fills(start: int, raw, header: ChunkHeader) -> None:
    """The chunk's footer range `[start, start + len(raw))` holds the chunk and at most a
    padding chunk up to the block boundary — and the gap really is one: a data chunk that
    ends on a boundary has a padding chunk's length, so a footer leaving it out would
    otherwise drop its records silently."""
    stop = chunk_end(start, header.data_size, header.num_records)
    have = start + len(raw)
    if have == stop:
        return
    if have != stop + padding_length(stop):
        raise ArrayRecordFormatError(
            f"the chunk ends at byte {stop}, but the footer gives it bytes up to {have}: "
            "more than one chunk and its padding (a chunk missing from the footer?)",
            offset=start, hint=CORRUPT_HINT,
        )
    gap = strip_block_headers(memoryview(raw)[stop - start :], stop)
    pad = _parse_chunk_header(ChunkHeader, gap, True, None, stop)
    if pad.chunk_type != CHUNK_PADDING or pad.num_records or \
            chunk_end(stop, pad.data_size, 0) != have:
        raise ArrayRecordFormatError(
            f"the chunk ends at byte {stop}, and the footer gives it bytes up to {have}, "
            f"but what lies between is not a padding chunk (type {pad.chunk_type:#x}, "
            f"{pad.num_records} records): a chunk missing from the footer?",
            offset=start, hint=CORRUPT_HINT,
        )


def decode_records(
    raws: Sequence,
    starts: Sequence[int],
    within: Sequence[int],
    *,
    verify: str = "headers",
    paths: Sequence[str | None] | None = None,
    chunks: Sequence[int | None] | None = None,
    counts: Sequence[int] | None = None,
    max_decoded: int = DEFAULT_MAX_DECODED,
) -> list[bytes]:
    """Record `within[i]` of the chunk whose physical bytes `raws[i]` begin at `starts[i]`.

    The same as `decode_chunk(raws[i], starts[i], expected_records=counts[i]).record(
    within[i])` for each i (`paths[i]` and `chunks[i]` name it in errors; `counts[i]` is the
    footer's record count for the chunk), but a one-record zstd or uncompressed chunk inside
    one block — group_size 1, the layout of shuffled training data — is decoded inline,
    with the same checks: a batch costs one call instead of eight per record. Each `raws[i]`
    is its chunk's whole range (see `decode_chunk`'s `whole_range`). Whatever the
    inline path does not accept, `decode_chunk` decodes, or names the error.
    """
    out: list[bytes] = []
    append = out.append
    hashes, data_hashes = verify != "none", verify == "all"
    budget = max_decoded - RECORD_COST
    try:
        dctx = _local.zstd
    except AttributeError:
        dctx = _zstd_decompressor()
    scratch = None
    for k, (raw, start, j) in enumerate(zip(raws, starts, within)):
        if j == 0 and (counts is None or counts[k] == 1):
            try:
                n = len(raw)
                crossed = headers_in(start, n)
                if crossed == 0:
                    record = one_record(memoryview(raw), budget, hashes, data_hashes, dctx)
                elif crossed > 0:
                    if scratch is None:
                        scratch = _scratch()
                    logical = strip_into(raw, start, crossed, scratch, hashes)
                    record = None if logical is None \
                        else one_record(logical, budget, hashes, data_hashes, dctx)
                else:
                    record = None
                if record is not None:
                    append(record)
                    continue
            except Exception:  # anything odd: the general path decodes it or says why
                pass
        _, records = decode_chunk(raw, start, verify=verify,
                                  path=paths[k] if paths is not None else None,
                                  chunk=chunks[k] if chunks is not None else None,
                                  expected_records=counts[k] if counts is not None else None,
                                  max_decoded=max_decoded, whole_range=True)
        if not 0 <= j < len(records):
            raise ArrayRecordFormatError(
                f"record {j} asked of a chunk of {len(records)} records",
                path=paths[k] if paths is not None else None, offset=start,
                chunk=chunks[k] if chunks is not None else None, hint=CORRUPT_HINT,
            )
        append(records.record(j))
    return out


def _scratch() -> bytearray:
    """This thread's buffer for the logical bytes of chunks that cross block boundaries."""
    try:
        return _local.scratch
    except AttributeError:
        buf = _local.scratch = bytearray()
        return buf


def _index_verify(verify: str) -> str:
    # The index is read once per file and everything else trusts it: hash all of it.
    return "none" if verify == "none" else "all"


def _parse_postscript(raw, pos: int, verify: str, path: str | None) -> int:
    """Footer offset from the postscript chunk at `pos` (the file's last block)."""
    try:
        if len(raw) < BLOCK_HEADER_SIZE + CHUNK_HEADER_SIZE:
            raise ArrayRecordFormatError("postscript truncated")
        if verify != "none":
            prev, _ = check_block_header(raw[:BLOCK_HEADER_SIZE], pos, path)
            if prev != 0:
                raise ArrayRecordFormatError("no chunk starts at the last 64 KiB block")
        # Three ~20-byte records: a 64 KiB bound keeps a crafted claim from costing anything.
        _, records = decode_chunk(raw, pos, verify=_index_verify(verify), path=path,
                                  max_decoded=POSTSCRIPT_MAX_DECODED, whole_range=True)
        for j in range(min(3, len(records))):  # copies 2 and 3 back up a damaged copy 1
            try:
                fields = parse_fields(records.view(j))
            except ArrayRecordFormatError:
                continue
            if fields.get(2) == POSTSCRIPT_MAGIC and isinstance(fields.get(1), int):
                footer_offset = int(fields[1])
                if not 64 <= footer_offset < pos:
                    raise ArrayRecordFormatError(
                        f"postscript points at footer offset {footer_offset}, outside the file"
                    )
                return footer_offset
        raise ArrayRecordFormatError("no record with the ArrayRecord magic number")
    except ArrayRecordFormatError as err:
        raise ArrayRecordFormatError(
            f"no valid ArrayRecord postscript in the last 64 KiB block: {err.what}",
            path=path, offset=pos,
            hint="this is not an ArrayRecord file, or it is truncated or corrupted",
        ) from None


def _parse_footer(raw, footer_offset: int, size: int, verify: str, path: str | None,
                  max_decoded: int = DEFAULT_MAX_DECODED):
    # Every chunk before the footer takes at least a chunk header: that bounds the entries
    # (and so the memory spent on them) before the footer is decoded.
    most = (footer_offset - 64) // CHUNK_HEADER_SIZE + 1
    _, chunk = decode_chunk(raw, footer_offset, verify=_index_verify(verify), path=path,
                             max_records=most, max_decoded=max_decoded, whole_range=True,
                             decoder=decode_footer_data)
    footer = cast(FooterData, chunk)  # what `decoder` returns
    meta = parse_fields(footer.metadata).get(1)
    if not isinstance(meta, bytes):
        raise ArrayRecordFormatError("footer metadata is not ArrayRecord metadata", path=path,
                                     offset=footer_offset, hint=CORRUPT_HINT)
    fields = parse_fields(meta)
    if fields.get(1) != 1:
        raise ArrayRecordFormatError(
            f"unsupported ArrayRecord metadata version {fields.get(1)!r}", path=path,
            offset=footer_offset, hint="the file was written by a newer array_record",
        )
    raw_options = fields.get(4, b"")
    options = raw_options.decode("utf-8", "replace") if isinstance(raw_options, bytes) else ""
    raw_spec = fields.get(ELEMENT_SPEC_FIELD, b"")  # checked where it is used (aioloader.typed)
    spec = raw_spec.decode("utf-8", "replace") if isinstance(raw_spec, bytes) else ""
    offsets, decoded, counts = footer.offsets, footer.decoded, footer.records
    n_chunks = len(offsets)
    claimed_chunks = fields.get(2, n_chunks)
    if claimed_chunks != n_chunks:
        raise ArrayRecordFormatError(
            f"footer lists {n_chunks} chunks, metadata says {claimed_chunks!r}",
            path=path, offset=footer_offset, hint=CORRUPT_HINT,
        )
    # Each chunk's span: to the next chunk, the last one to the footer.
    spans = np.empty_like(offsets)
    np.subtract(offsets[1:], offsets[:-1], out=spans[:-1])
    if n_chunks:
        spans[-1] = footer_offset - offsets[-1]
    if n_chunks and (offsets[0] < 64 or spans.min() <= 0):
        raise ArrayRecordFormatError(
            "footer chunk offsets are not increasing within the file", path=path,
            offset=footer_offset, hint=CORRUPT_HINT,
        )
    # A data chunk holds at least one record, and a chunk of n records occupies at least n
    # bytes (Riegeli's chunk_end), so the counts are bounded by the file and sum safely.
    bad = np.flatnonzero((counts < 1) | (counts > spans))
    if bad.size:
        c = int(bad[0])
        raise ArrayRecordFormatError(
            f"footer says chunk {c} holds {int(counts[c])} records, but a chunk holds at "
            f"least 1 and its {int(spans[c])} bytes hold at most {int(spans[c])}",
            path=path, offset=footer_offset, chunk=c, hint=CORRUPT_HINT,
        )
    total = int(counts.sum())
    claimed = fields.get(3, total)
    if claimed != total:
        raise ArrayRecordFormatError(
            f"footer chunks hold {total} records, metadata says {claimed!r}",
            path=path, offset=footer_offset, hint=CORRUPT_HINT,
        )
    return FileIndex(
        path=path,
        size=size,
        footer_offset=footer_offset,
        chunk_offsets=offsets,
        chunk_records=compact_counts(counts),
        chunk_decoded_sizes=compact_sizes(decoded),
        writer_options=options,
        element_spec=spec,
    )
