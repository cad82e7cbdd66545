"""A Parquet file's footer: which tail bytes to read, and the thrift `FileMetaData` in them.

A Parquet file ends with the thrift-encoded `FileMetaData`, its length (4 bytes, little
endian) and the magic `PAR1`. Its length is unknown until the last 8 bytes are read, so the
index step reads a speculative tail first (`tail_range`: 64 KiB, what Arrow's own reader
reads, and enough for most footers) and asks for the rest only when the footer is longer
(`footer_range` says which bytes the footer spans; `footer_from_tail` cuts it out of the
tail when the tail holds it). Each declared length is checked against the file's size and
the memory budget before anything is allocated for it, and the thrift parser is held to
limits derived from the footer's own length, after our own reader has walked it (every
count held to the bytes there), so a lying footer is a `ParquetFormatError` naming the
file, never a crash or a huge allocation.

pyarrow parses the thrift (it is the `parquet` extra) and is imported only here and in the
decode step, when a Parquet file is opened: `import aioloader` never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CORRUPT_HINT, ParquetFormatError
from .metadata import FooterMeta, SchemaTooDeep, read_footer_meta
from .thrift import ThriftError

if TYPE_CHECKING:
    import pyarrow.parquet as pq

__all__ = ["MAGIC", "TAIL_BYTES", "ParquetFooter", "footer_from_tail", "footer_range",
           "parse_footer", "pyarrow_parquet", "tail_range"]

MAGIC = b"PAR1"
ENCRYPTED_MAGIC = b"PARE"
#: bytes after the footer: its length (4) and the magic (4)
TRAILER = 8
#: what the index step reads first; the footer of a file with a few hundred row groups
TAIL_BYTES = 64 * 1024
#: the smallest Parquet file: magic, an empty footer's length and magic
MIN_SIZE = 2 * len(MAGIC) + 4


def pyarrow_parquet() -> Any:
    """`pyarrow.parquet`, imported on first use; a one-line `ImportError` without it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("reading Parquet needs the 'parquet' extra (no module named "
                          f"{e.name!r}): pip install 'aioloader[parquet]'",
                          name=e.name) from e
    return pq


def tail_range(size: int, tail_bytes: int = TAIL_BYTES) -> tuple[int, int]:
    """(offset, length) of the speculative first read of a file of `size` bytes."""
    length = min(size, max(tail_bytes, TRAILER))
    return size - length, length


def footer_range(path: str, size: int, tail: bytes | memoryview, *,
                 max_bytes: int) -> tuple[int, int]:
    """(offset, length) of the footer: the thrift `FileMetaData` and the 8 bytes after it.

    `tail` is any number (at least 8) of the file's last bytes. Raises `ParquetFormatError`
    when the file is too short, the magic is wrong, or the declared length does not fit in
    the file or in `max_bytes`.
    """
    if size < MIN_SIZE:
        raise ParquetFormatError(f"{size} bytes is too short for a Parquet file "
                                 f"(at least {MIN_SIZE})", path=path, hint=CORRUPT_HINT)
    if len(tail) < TRAILER or len(tail) > size:
        raise ValueError(f"{path}: a tail of {len(tail)} bytes from a file of {size}")
    magic = bytes(tail[-4:])
    if magic == ENCRYPTED_MAGIC:
        raise ParquetFormatError("the footer is encrypted, which is not supported", path=path,
                                 hint="write the file without Parquet modular encryption")
    if magic != MAGIC:
        raise ParquetFormatError(f"the file ends with {magic!r}, not the Parquet magic "
                                 f"{MAGIC!r}", path=path, offset=size - 4,
                                 hint="is it a Parquet file? " + CORRUPT_HINT)
    length = int.from_bytes(tail[-TRAILER:-4], "little")
    if length > size - MIN_SIZE:
        raise ParquetFormatError(f"the footer declares {length} bytes, more than the "
                                 f"{size}-byte file holds", path=path, offset=size - TRAILER,
                                 hint=CORRUPT_HINT)
    if length + TRAILER > max_bytes:
        raise ParquetFormatError(f"the footer declares {length} bytes, more than the memory "
                                 f"budget of {max_bytes} bytes allows", path=path,
                                 offset=size - TRAILER,
                                 hint="raise max_bytes (the loader's memory_budget)")
    return size - TRAILER - length, length + TRAILER


def footer_from_tail(path: str, size: int, tail: bytes | memoryview, *,
                     max_bytes: int) -> bytes | None:
    """The footer cut out of `tail` (the file's last bytes), or None when the footer starts
    before the tail does: then read `footer_range(...)` and pass that to `parse_footer`."""
    _, length = footer_range(path, size, tail, max_bytes=max_bytes)
    if length > len(tail):
        return None
    return bytes(tail[len(tail) - length:])


@dataclass(frozen=True)
class ParquetFooter:
    """A file's footer, parsed: its bytes (the 8 after the thrift included), the row
    groups' figures (read by our own thrift reader) and pyarrow's `FileMetaData` (which
    the schema and the decoding use)."""

    data: bytes
    figures: FooterMeta
    meta: pq.FileMetaData


def parse_footer(path: str, size: int, footer: bytes, *, max_bytes: int) -> ParquetFooter:
    """The file's footer, from `footer`: exactly the bytes `footer_range` names.

    Our own reader walks the thrift first, holding every list and string to the bytes that
    are there; only then does pyarrow parse it (pyarrow sizes a list from its declared
    count before reading it: a 1 MB footer could make it allocate hundreds of MB). Bad
    thrift is a `ParquetFormatError` naming the file.
    """
    offset, length = footer_range(path, size, footer[-TRAILER:] if len(footer) >= TRAILER
                                  else footer, max_bytes=max_bytes)
    if len(footer) != length:
        raise ValueError(f"{path}: the footer is {length} bytes, {len(footer)} were given")
    try:
        figures = read_footer_meta(footer)
    except SchemaTooDeep as e:
        raise ParquetFormatError(str(e), path=path, offset=offset + e.offset,
                                 hint="flatten the schema's nesting") from None
    except ThriftError as e:
        raise ParquetFormatError(f"its footer's thrift does not parse: {e}", path=path,
                                 offset=offset + e.offset, hint=CORRUPT_HINT) from None
    pq = pyarrow_parquet()
    import pyarrow as pa

    # Every string and every list item takes at least one byte of the footer: limits of
    # the footer's own length keep the thrift parser from allocating what is not there.
    limit = max(length, 1)
    try:
        meta = pq.ParquetFile(pa.BufferReader(footer), thrift_string_size_limit=limit,
                              thrift_container_size_limit=limit).metadata
    except (pa.ArrowException, OSError, ValueError, MemoryError) as e:
        raise ParquetFormatError(f"the footer's thrift does not parse: {e}", path=path,
                                 offset=offset, hint=CORRUPT_HINT) from None
    return ParquetFooter(bytes(footer), figures, meta)
