"""The compression codecs of Riegeli simple chunks: none, zstd, brotli, raw snappy.

A compressed block is `varint(decompressed_length) || codec stream`; an uncompressed block is
the raw bytes. Before any decompression the claimed length is checked against what the caller
expects, against the caller's bound (a memory budget) and against what the stream itself
declares, so a crafted file cannot make us allocate more than the budget allows. A stream must
then decode to exactly the claimed length: shorter or longer is an error, never padding.
Brotli declares no length of its own, so it decodes into a buffer of the claimed length plus
one byte and stops there, however much the stream would produce.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import cramjam
import numpy as np
import zstandard

from .errors import ArrayRecordFormatError
from .varint import encode_varint, read_varint

NONE = 0x00
BROTLI = 0x62  # 'b'
ZSTD = 0x7A  # 'z'
SNAPPY = 0x73  # 's'

CODEC_NAMES = {NONE: "uncompressed", BROTLI: "brotli", ZSTD: "zstd", SNAPPY: "snappy"}

# The largest decompressed:compressed ratio each codec can reach (zstd RLE blocks ~32k:1,
# snappy ~21:1); brotli has no practical bound, so it relies on the hashed chunk header.
_MAX_RATIO = {NONE: 1, SNAPPY: 24, ZSTD: 1 << 16}

_local = threading.local()
_frame_content_size = zstandard.frame_content_size


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    # window_log up to 31 is legal in ArrayRecord files; zstandard's default refuses > 27.
    d = getattr(_local, "zstd", None)
    if d is None:
        d = _local.zstd = zstandard.ZstdDecompressor(max_window_size=1 << 31)
    return d


@dataclass(frozen=True, slots=True)
class Compression:
    """A codec with its level and window, as named in the writer options string."""

    codec: int = ZSTD
    level: int | None = 3
    window_log: int | None = None

    @property
    def name(self) -> str:
        return CODEC_NAMES[self.codec]

    def compress_block(self, data) -> bytes:
        """Encode one block (sizes or values) of a simple chunk."""
        if self.codec == NONE:
            return bytes(data)
        prefix, stream = self._compress_parts(data)
        return prefix + stream

    def _compress_parts(self, data) -> tuple[bytes, bytes]:
        """A compressed block as (length prefix, codec stream), to save concatenating them."""
        if self.codec == ZSTD:
            key = (self.level, self.window_log)
            cache = getattr(_local, "zstd_c", None)
            if cache is None or cache[0] != key:
                params = zstandard.ZstdCompressionParameters.from_level(
                    3 if self.level is None else self.level,
                    window_log=self.window_log or 20,
                    write_content_size=1,
                    write_checksum=0,
                )
                cache = _local.zstd_c = (key, zstandard.ZstdCompressor(compression_params=params))
            stream = cache[1].compress(bytes(data))
        elif self.codec == BROTLI:
            stream = bytes(cramjam.brotli.compress(bytes(data), 6 if self.level is None
                                                   else self.level))
        else:
            stream = bytes(cramjam.snappy.compress_raw(bytes(data)))
        return encode_varint(len(data)), stream


def decompress_block(codec: int, block, expected: int | None, max_size: int):
    """Decode one block; `expected` is the exact decoded length when the caller knows it.

    `max_size` bounds the decoded length when it is not known exactly.
    """
    out = _decompress(codec, block, expected, max_size)
    return out if codec == NONE else memoryview(out)


def _decompress(codec: int, block, expected: int | None, max_size: int):
    """`decompress_block`, but returning the codec's own output object (`bytes` for zstd, a
    slice of `block` for uncompressed) rather than a memoryview of it. The checks raise
    through helpers, so the path that passes them makes no extra call."""
    if codec == NONE:
        if (expected is not None and len(block) != expected) or len(block) > max_size:
            raise _uncompressed_error(len(block), expected, max_size)
        return block
    if codec not in CODEC_NAMES:
        raise ArrayRecordFormatError(f"unknown compression type 0x{codec:02x}")
    size, pos = read_varint(block, 0)
    stream = block[pos:]
    ratio = _MAX_RATIO.get(codec)
    if (expected is not None and size != expected) or size > max_size or \
            (ratio is not None and size > ratio * len(stream) + 64):
        raise _claim_error(codec, size, len(stream), expected, max_size)
    try:
        if codec == ZSTD:  # inline: the hot path for zstd files
            declared = _frame_content_size(stream)
            try:
                dctx = _local.zstd
            except AttributeError:
                dctx = _zstd_decompressor()
            if declared >= 0:
                if declared != size:
                    raise ArrayRecordFormatError(
                        f"zstd frame declares {declared} bytes, block prefix says {size}"
                    )
                # Allocates exactly `declared`; libzstd fails a frame that decodes to more
                # or less than its content size. (Bytes after the frame are ignored: they
                # cannot change the output, and refusing them would cost time per record.)
                out = dctx.decompress(stream)
            else:
                # No content size in the frame: zstandard then allocates exactly
                # `max_output_size` and raises ZstdError rather than write past it, and copies
                # nothing. It refuses 0 here, so an empty block asks for 1 (a 1-byte result
                # then fails the length check below).
                out = dctx.decompress(stream, max_output_size=size or 1)
        elif codec == BROTLI:
            return _brotli(stream, size)
        else:  # snappy
            declared, _ = read_varint(stream, 0)
            if declared != size:
                raise ArrayRecordFormatError(
                    f"snappy stream declares {declared} bytes, block prefix says {size}"
                )
            out = cramjam.snappy.decompress_raw(stream, output_len=size)
    except ArrayRecordFormatError:
        raise
    except Exception as exc:  # codec libraries raise their own types
        raise ArrayRecordFormatError(
            f"{CODEC_NAMES[codec]} stream does not decode: {exc}"
        ) from None
    if len(out) != size:
        raise ArrayRecordFormatError(
            f"{CODEC_NAMES[codec]} block decoded to {len(out)} bytes, prefix says {size}"
        )
    return out


def _uncompressed_error(length: int, expected: int | None,
                        max_size: int) -> ArrayRecordFormatError:
    if expected is not None and length != expected:
        return ArrayRecordFormatError(
            f"uncompressed block holds {length} bytes, header says {expected}")
    return ArrayRecordFormatError(f"uncompressed block of {length} bytes, more than the "
                                  f"{max_size} this chunk can hold")


def _claim_error(codec: int, size: int, stream_len: int, expected: int | None,
                 max_size: int) -> ArrayRecordFormatError:
    """Why a compressed block's claimed decoded length is refused, before decoding it."""
    name = CODEC_NAMES[codec]
    if expected is not None and size != expected:
        return ArrayRecordFormatError(
            f"{name} block claims {size} decoded bytes, header says {expected}")
    if size > max_size:
        return ArrayRecordFormatError(f"{name} block claims {size} decoded bytes, more than "
                                      f"the {max_size} this chunk can hold")
    return ArrayRecordFormatError(f"{name} block of {stream_len} bytes cannot decode to "
                                  f"{size} bytes")


def _brotli(stream, size: int) -> np.ndarray:
    """A brotli stream that must decode to exactly `size` bytes."""
    # Not `decompress(output_len=)`: it pads a short stream with zeros and lets a long
    # one grow. Untouched pages of the buffer cost no memory.
    buf = np.empty(size + 1, dtype=np.uint8)
    try:
        n = cramjam.brotli.decompress_into(stream, buf)  # type: ignore[arg-type]  # a buffer
    except cramjam.DecompressionError as exc:
        if "whole buffer" not in str(exc):
            raise
        n = size + 1
    if n != size:
        raise ArrayRecordFormatError(
            f"brotli stream decodes to {'more than ' if n > size else ''}"
            f"{min(n, size)} bytes, block prefix says {size}"
        )
    return buf[:size]

