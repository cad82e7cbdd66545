"""Open an ArrayRecord file from byte ranges: postscript, footer, and the chunk index.

Opening is written sans-I/O: `open_index` is a generator that yields `(offset, length)` read
requests and receives the bytes, so the same parser serves a local pread, a blocking fsspec
file and an asyncio range reader (see `read_index` for the synchronous driver). A speculative
tail read covers postscript and footer in one round trip for typical files; a second read is
issued only when the footer starts before the tail. Where round trips are cheap (a local
pread), `small_reads` reads instead by what the file declares: the postscript's first bytes,
then the footer chunk and its padding chunk's header — a few KiB, not the whole 128 KiB of a
small file's tail, most of it padding — with every check the tail read makes. A footer too
large to hold twice (over `footerstream.STREAM_FROM`) is read in windows instead, whichever
way the open began (`footerstream`).

What this module owns is the opening: the read requests and the checks of the footer. The
postscript's parse lives in `postscript`; the `FileIndex` it returns in `fileindex`; decoding
chunks once a file is open (also used here, for the footer chunk) in `decoding`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import cast

import numpy as np

from . import footerstream, postscript, quickopen
from .decoding import decode_chunk, decode_records, fills_end
from .errors import CORRUPT_HINT, ArrayRecordFormatError
from .fileindex import FileIndex, compact_counts, compact_sizes, ones_like
from .footer import FooterData, decode_footer_data
from .footerstream import LOCAL_WINDOW, REMOTE_STREAM_FROM, REMOTE_WINDOW, STREAM_FROM
from .footerstream import check_length as _check_length
from .layout import (
    _HEADER,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    add_with_overhead,
    chunk_end,
    strip_block_headers,
)
from .levels import DEFAULT_MAX_DECODED, DEFAULT_VERIFY, VERIFY_LEVELS
from .proto import ELEMENT_SPEC_FIELD, parse_fields

__all__ = [  # decode_*, FileIndex and compact_* live beside this module; importable here too
    "DEFAULT_TAIL",
    "FileIndex",
    "compact_counts",
    "compact_sizes",
    "decode_chunk",
    "decode_records",
    "open_index",
    "read_index",
]

DEFAULT_TAIL = 1 << 18  # 256 KiB: postscript + footers of files up to ~50k chunks
# `small_reads`: the usual postscript chunk and its padding chunk's header take ~200 bytes;
# a first footer read of a few KiB holds the footers of files of up to ~500 chunks.
POSTSCRIPT_PROBE = 512
FOOTER_PROBE = 1 << 13
MIN_FILE_SIZE = 2 * BLOCK_SIZE

ReadRequest = tuple[int, int]


def _check_verify(verify: str) -> None:
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")


def open_index(
    size: int,
    *,
    path: str | None = None,
    verify: str = DEFAULT_VERIFY,
    tail: int = DEFAULT_TAIL,
    max_decoded: int = DEFAULT_MAX_DECODED,
    small_reads: bool = False,
    span: int | None = None,
) -> Generator[ReadRequest, bytes | memoryview, FileIndex]:
    """Parse a file's index; yields read requests, returns a `FileIndex`.

    `max_decoded` bounds what the footer may take to read and decode (see `decode_chunk`).
    `small_reads` trades the one speculative tail read for two or three small ones (see the
    module's docstring); `span` (instead of `tail`) makes the one speculative read the `span`
    bytes before the postscript and the postscript's head, not the rest of its block. The
    index, and the error for a damaged file, are the same.
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
    if small_reads:
        return (yield from _open_small(size, path, verify, tail_start, max_decoded))
    if span is not None:
        return (yield from _open_span(size, path, verify, span, max_decoded))
    tail_bytes = yield (tail_start, tail)
    _check_length(tail_bytes, tail, tail_start, path)
    post_at = size - BLOCK_SIZE
    with _locating(path, post_at):
        footer_offset = postscript.parse_postscript(
            memoryview(tail_bytes)[post_at - tail_start :], post_at, verify, path
        )
    return (yield from _footer_from(tail_bytes, tail_start, footer_offset, size, path, verify,
                                    max_decoded))


def _footer_from(buf, buf_at: int, footer_offset: int, size: int, path: str | None,
                 verify: str, max_decoded: int,
                 ) -> Generator[ReadRequest, bytes | memoryview, FileIndex]:
    """The footer's whole range (to the postscript) from `buf`, the bytes read from `buf_at`
    on, or, when it starts before them, by one more read; parsed and checked."""
    post_at = size - BLOCK_SIZE
    if footer_offset >= buf_at:
        footer_raw: bytes | memoryview = (
            memoryview(buf)[footer_offset - buf_at : post_at - buf_at])
    else:
        span = post_at - footer_offset  # read whole from a bucket up to REMOTE_STREAM_FROM
        stream_from = REMOTE_STREAM_FROM if 4 * span <= max_decoded else STREAM_FROM
        streamed = yield from _streamed(footer_offset, size, path, verify, max_decoded,
                                        REMOTE_WINDOW, max(stream_from, STREAM_FROM))
        if streamed is not None:
            return streamed
        _check_span(post_at - footer_offset, max_decoded, footer_offset, path)
        footer_raw = yield (footer_offset, post_at - footer_offset)
        _check_length(footer_raw, post_at - footer_offset, footer_offset, path)
    with _locating(path, footer_offset):
        index = _parse_footer(footer_raw, footer_offset, size, verify, path, max_decoded)
    # the footer's own bytes, without its padding (None: unknown): what sizes the next read
    vars(index)["footer_need"] = _footer_needs(footer_raw, footer_offset, post_at)
    return index


def _streamed(footer_offset: int, size: int, path: str | None, verify: str, max_decoded: int,
              window: int, stream_from: int,
              ) -> Generator[ReadRequest, bytes | memoryview, FileIndex | None]:
    """A large footer's index by `footerstream` (read in windows, never held whole); None
    for a footer up to `stream_from` bytes, or one that path does not take (the caller
    reads it whole)."""
    if size - BLOCK_SIZE - footer_offset <= stream_from or not footerstream.available():
        return None
    check = postscript.index_verify(verify) != "none"
    footer = yield from footerstream.stream_footer(footer_offset, size, path=path, check=check,
                                                   max_decoded=max_decoded, window=window)
    if footer is None:
        return None
    with _locating(path, footer_offset):
        return _index_from(footer, footer_offset, size, path)


def _check_span(span: int, max_decoded: int, footer_offset: int, path: str | None) -> None:
    """Refuse a footer range larger than the memory budget before reading it."""
    if span > max_decoded:
        raise ArrayRecordFormatError(
            f"the footer would span {span} bytes, more than the memory budget of "
            f"{max_decoded} bytes allows", path=path, offset=footer_offset,
            hint="the postscript is corrupted or crafted; if the file is genuine, raise the "
            "budget (the loader's memory_budget)",
        )


def _postscript_from(head, size: int, path: str | None, verify: str,
                     ) -> Generator[ReadRequest, bytes | memoryview, int]:
    """The footer offset from the postscript's first bytes (`head`), or, for an unusual or
    damaged postscript, from its whole block, read and parsed as the tail read does."""
    post_at = size - BLOCK_SIZE
    footer_offset = postscript.quick_postscript(head, post_at, verify, size)
    if footer_offset is None:
        block = yield (post_at, BLOCK_SIZE)
        _check_length(block, BLOCK_SIZE, post_at, path)
        with _locating(path, post_at):
            footer_offset = postscript.parse_postscript(block, post_at, verify, path)
    return footer_offset


def _open_span(size: int, path: str | None, verify: str, span: int, max_decoded: int,
               ) -> Generator[ReadRequest, bytes | memoryview, FileIndex]:
    """`open_index` by one read of the `span` bytes before the postscript and the
    postscript's head: a remote file's footer and padding in one round trip, without the
    rest of the postscript's 64 KiB block (or, for small files, the whole file)."""
    post_at = size - BLOCK_SIZE
    start = max(0, post_at - span)
    want = post_at + POSTSCRIPT_PROBE - start
    buf = yield (start, want)
    _check_length(buf, want, start, path)
    footer_offset = yield from _postscript_from(memoryview(buf)[post_at - start :], size, path,
                                                verify)
    return (yield from _footer_from(buf, start, footer_offset, size, path, verify,
                                    max_decoded))


def _open_small(size: int, path: str | None, verify: str, tail_start: int, max_decoded: int,
                ) -> Generator[ReadRequest, bytes | memoryview, FileIndex]:
    """`open_index` by small reads. Anything unusual or damaged is read and parsed as the
    tail read would have it (the whole postscript block, the footer's whole range), so it
    opens, or fails, alike."""
    post_at = size - BLOCK_SIZE
    head = yield (post_at, POSTSCRIPT_PROBE)
    _check_length(head, POSTSCRIPT_PROBE, post_at, path)
    footer_offset = yield from _postscript_from(head, size, path, verify)
    span = post_at - footer_offset
    streamed = yield from _streamed(footer_offset, size, path, verify, max_decoded,
                                    LOCAL_WINDOW, STREAM_FROM)
    if streamed is not None:
        return streamed
    if footer_offset < tail_start:
        _check_span(span, max_decoded, footer_offset, path)
    want = min(span, FOOTER_PROBE)
    raw = yield (footer_offset, want)
    _check_length(raw, want, footer_offset, path)
    quick = quickopen.footer_index(raw, footer_offset, size, verify, path, max_decoded, post_at)
    if quick is not None:  # the usual footer, within the first read
        return quick
    need = _footer_needs(raw, footer_offset, post_at)
    if need is not None and want < need <= min(span, max_decoded):
        want = need
        raw = yield (footer_offset, want)
        _check_length(raw, want, footer_offset, path)
    if need is not None and need <= want:
        try:
            with _locating(path, footer_offset):
                return _parse_footer(memoryview(raw)[:need], footer_offset, size, verify, path,
                                     max_decoded, range_end=post_at)
        except ArrayRecordFormatError:
            pass  # named below, from the whole range, as the tail read names it
    if want < span:
        raw = yield (footer_offset, span)
        _check_length(raw, span, footer_offset, path)
    with _locating(path, footer_offset):
        return _parse_footer(raw, footer_offset, size, verify, path, max_decoded)


def _footer_needs(raw, footer_offset: int, post_at: int) -> int | None:
    """How many bytes from `footer_offset` hold the footer chunk and its padding chunk's
    header, by the footer chunk's header in `raw` (not checked here: the parse checks it);
    None when `raw` does not say or the footer would not end before the postscript."""
    try:
        header_end = add_with_overhead(footer_offset, CHUNK_HEADER_SIZE)
        if header_end - footer_offset > len(raw):
            return None
        logical = strip_block_headers(memoryview(raw)[: header_end - footer_offset],
                                      footer_offset, verify=False)
        _, data_size, _, type_count, _ = _HEADER.unpack_from(logical)
        stop = chunk_end(footer_offset, data_size, type_count >> 8)
        if stop > post_at:
            return None
        return fills_end(stop, post_at) - footer_offset
    except Exception:  # anything odd: the whole range is read and parsed
        return None


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
    verify: str = DEFAULT_VERIFY,
    tail: int = DEFAULT_TAIL,
    max_decoded: int = DEFAULT_MAX_DECODED,
    small_reads: bool = False,
    span: int | None = None,
) -> FileIndex:
    """Drive `open_index` with a blocking `fetch(offset, length) -> bytes`."""
    steps = open_index(size, path=path, verify=verify, tail=tail, max_decoded=max_decoded,
                       small_reads=small_reads, span=span)
    try:
        request = next(steps)
        while True:
            request = steps.send(fetch(*request))
    except StopIteration as done:
        return done.value


def _parse_footer(raw, footer_offset: int, size: int, verify: str, path: str | None,
                  max_decoded: int = DEFAULT_MAX_DECODED, range_end: int | None = None):
    quick = quickopen.footer_index(raw, footer_offset, size, verify, path, max_decoded,
                                   footer_offset + len(raw) if range_end is None else range_end)
    if quick is not None:  # the usual footer, in one native call with the same checks
        return quick
    # Every chunk before the footer takes at least a chunk header: that bounds the entries
    # (and so the memory spent on them) before the footer is decoded.
    most = (footer_offset - 64) // CHUNK_HEADER_SIZE + 1
    def decoder(header, data, budget):
        return decode_footer_data(header, data, budget, footer_offset)

    _, chunk = decode_chunk(raw, footer_offset, verify=postscript.index_verify(verify), path=path,
                            max_records=most, max_decoded=max_decoded, whole_range=True,
                            range_end=range_end, decoder=decoder)
    return _index_from(cast(FooterData, chunk), footer_offset, size, path)  # `decoder`'s


def _index_from(footer: FooterData, footer_offset: int, size: int,
                path: str | None) -> FileIndex:
    """The index of a decoded footer, its metadata and entries checked against the file."""
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
    # the element spec is checked where it is used (aioloader.elements.typed)
    raw_spec = fields.get(ELEMENT_SPEC_FIELD, b"")
    spec = raw_spec.decode("utf-8", "replace") if isinstance(raw_spec, bytes) else ""
    offsets, decoded, counts = footer.offsets, footer.decoded, footer.records
    n_chunks = len(offsets)
    _agrees(fields, 2, n_chunks, "footer lists {} chunks", path, footer_offset)
    if footer.checked is not None:  # the C parser checked the entries as it read them
        total, most_records, widest = footer.checked
        sizes = (decoded.astype(np.uint32) if n_chunks and widest < 1 << 32 and
                 decoded.dtype != np.uint32 else decoded)
    else:
        total, most_records = _check_entries(offsets, counts, footer_offset, path)
        sizes = compact_sizes(decoded)
    _agrees(fields, 3, total, "footer chunks hold {} records", path, footer_offset)
    index = FileIndex(
        path=path,
        size=size,
        footer_offset=footer_offset,
        chunk_offsets=offsets,
        chunk_records=ones_like(counts) if most_records == 1 else compact_counts(counts),
        chunk_decoded_sizes=sizes,
        writer_options=options,
        element_spec=spec,
    )
    vars(index).update(num_records=total, max_records=most_records)  # known: not recounted
    return index


_min, _max, _add = np.minimum.reduce, np.maximum.reduce, np.add.reduce


def _check_entries(offsets: np.ndarray, counts: np.ndarray, footer_offset: int,
                   path: str | None) -> tuple[int, int]:
    """Check the footer's chunk offsets and record counts against the file; return the
    records in all chunks and the most in one. (Called once per file: a few NumPy calls,
    which is most of what opening a small file costs.)"""
    n_chunks = len(offsets)
    if not n_chunks:
        return 0, 0
    # Each chunk's span: to the next chunk, the last one to the footer.
    spans = np.empty_like(offsets)
    np.subtract(offsets[1:], offsets[:-1], out=spans[:-1])
    spans[-1] = footer_offset - offsets[-1]
    if offsets[0] < 64 or _min(spans) <= 0:
        raise ArrayRecordFormatError(
            "footer chunk offsets are not increasing within the file", path=path,
            offset=footer_offset, hint=CORRUPT_HINT,
        )
    least, most = int(_min(counts)), int(_max(counts))
    if least == 1 and most == 1:  # every span is at least 1 byte: one record fits each
        return n_chunks, 1
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
    return int(_add(counts)), most


def _agrees(fields: dict, number: int, actual: int, what: str, path: str | None,
            offset: int) -> None:
    """The metadata's field `number`, where present, says `actual` too (a file that lies
    about its counts is refused, naming both)."""
    claimed = fields.get(number, actual)
    if claimed != actual:
        raise ArrayRecordFormatError(f"{what.format(actual)}, metadata says {claimed!r}",
                                     path=path, offset=offset, hint=CORRUPT_HINT)
