"""Decoding chunks from their physical bytes: one chunk whole (`decode_chunk`), or one record
each of many chunks (`decode_records`, with an inline path for one-record chunks).

These are what readers call once a file is open (the source, the workers, `RangeReader`);
opening a file (`index`) uses `decode_chunk` for the postscript and footer chunks too.
"""

from __future__ import annotations

from collections.abc import Sequence

from .chunk import (
    DEFAULT_MAX_DECODED,
    DEFAULT_VERIFY,
    RECORD_COST,
    ChunkRecords,
    decode_simple,
    verify_data,
)
from .codecs import _local, _zstd_decompressor
from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .layout import (
    BLOCK_HEADER_SIZE,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    CHUNK_PADDING,
    CHUNK_TRANSPOSED,
    ChunkHeader,
    _parse_chunk_header,
    add_with_overhead,
    chunk_end,
    padding_length,
    strip_block_headers,
)
from .onerecord import headers_in, one_record, strip_into
from .transposed import decode_transposed


def decode_chunk(
    raw,
    start: int,
    *,
    verify: str = DEFAULT_VERIFY,
    path: str | None = None,
    chunk: int | None = None,
    expected_records: int | None = None,
    max_records: int | None = None,
    max_decoded: int = DEFAULT_MAX_DECODED,
    whole_range: bool = False,
    range_end: int | None = None,
    decoder=decode_simple,
) -> tuple[ChunkHeader, ChunkRecords]:
    """Decode the first chunk in the physical bytes `raw`, which begin at file offset `start`.

    Trailing bytes (padding chunks, the next chunk) are ignored, unless `whole_range` says
    `raw` is the chunk's whole range (up to the next chunk the footer lists): then the chunk,
    and at most a padding chunk to the next block boundary, must fill it exactly, or the
    footer left a chunk out; `range_end` says that range ends there though `raw` holds only
    its start (through the padding chunk's header: see `fills_end`). With `expected_records` (the
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
        n = header.num_records
        if len(logical) < end or (expected_records is not None and n != expected_records) \
                or (max_records is not None and n > max_records):
            raise _refused(header, len(logical), start, expected_records, max_records)
        if whole_range:
            _check_fills(start, raw, header, range_end)
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


def _refused(header: ChunkHeader, have: int, start: int, expected_records: int | None,
             max_records: int | None) -> ArrayRecordFormatError:
    """Why `decode_chunk` refuses a chunk its header describes, before decompressing it:
    its data is cut short, or it holds another record count than the footer's or more than
    its place can hold (checked in that order)."""
    n = header.num_records
    if have < CHUNK_HEADER_SIZE + header.data_size:
        what = (f"chunk data truncated: header says {header.data_size} bytes, range holds "
                f"{have - CHUNK_HEADER_SIZE}")
    elif expected_records is not None and n != expected_records:
        what = f"chunk holds {n} records, the footer says {expected_records}"
    else:
        what = (f"chunk declares {n} records, more than the {max_records} its place in the "
                "file can hold")
    return ArrayRecordFormatError(what, offset=start, hint=CORRUPT_HINT)


def fills_end(stop: int, have: int) -> int:
    """How far a chunk's range must be read to check its fill (`_check_fills`): a chunk that
    ends at `stop` in a range ending at `have` needs the padding chunk's header, and no more
    (the padding's zeros are not checked, and any block header inside the padding falls
    inside that header: a padding chunk runs to the first boundary at least 40 bytes on)."""
    return stop if have == stop else min(have, add_with_overhead(stop, CHUNK_HEADER_SIZE))


def _check_fills(start: int, raw, header: ChunkHeader, have: int | None = None) -> None:
    """The chunk's footer range `[start, have)` holds the chunk and at most a padding chunk
    up to the block boundary — and the gap really is one: a data chunk that ends on a
    boundary has a padding chunk's length, so a footer leaving it out would otherwise drop
    its records silently. `raw` is the range's bytes, or (with `have`) at least its first
    `fills_end` bytes."""
    stop = chunk_end(start, header.data_size, header.num_records)
    if have is None:
        have = start + len(raw)
    if have == stop:
        return
    if have != stop + padding_length(stop):
        raise ArrayRecordFormatError(
            f"the chunk ends at byte {stop}, but the footer gives it bytes up to {have}: "
            "more than one chunk and its padding (a chunk missing from the footer?)",
            offset=start, hint=CORRUPT_HINT,
        )
    check_gap(memoryview(raw)[stop - start : fills_end(stop, have) - start], stop, have, start)


def check_gap(raw, stop: int, have: int, start: int) -> None:
    """The bytes `raw` from `stop` to `fills_end(stop, have)` begin a padding chunk that runs
    to `have` (see `_check_fills`; `start` is where the chunk before it starts)."""
    gap = strip_block_headers(raw, stop)
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
    verify: str = DEFAULT_VERIFY,
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
                crossed = headers_in(start, len(raw))  # -1: not for the inline path
                logical = memoryview(raw) if crossed == 0 else None
                if crossed > 0:
                    if scratch is None:
                        scratch = _scratch()
                    logical = strip_into(raw, start, crossed, scratch, hashes)
                record = None if logical is None \
                    else one_record(logical, budget, hashes, data_hashes, dctx)
                if record is not None:
                    append(record)
                    continue
            except Exception:  # anything odd: the general path decodes it or says why
                pass
        path = paths[k] if paths is not None else None
        chunk = chunks[k] if chunks is not None else None
        _, records = decode_chunk(raw, start, verify=verify, path=path, chunk=chunk,
                                  expected_records=counts[k] if counts is not None else None,
                                  max_decoded=max_decoded, whole_range=True)
        if not 0 <= j < len(records):
            raise ArrayRecordFormatError(f"record {j} asked of a chunk of {len(records)} "
                                         "records", path=path, offset=start, chunk=chunk,
                                         hint=CORRUPT_HINT)
        append(records.record(j))
    return out


def _scratch() -> bytearray:
    """This thread's buffer for the logical bytes of chunks that cross block boundaries."""
    try:
        return _local.scratch
    except AttributeError:
        buf = _local.scratch = bytearray()
        return buf
