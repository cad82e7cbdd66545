"""A footer chunk's block decoded as it arrives, within what the memory budget leaves.

`footerstream` reads a large footer in windows and hands each block's stored bytes on in
pieces; this module turns them into decoded bytes for its parsers without holding a block
whole: stored bytes pass through, a zstd frame goes through a stream writer whose output
comes in bounded pieces. The decoder's window is what a crafted frame could make large (a
few bytes may declare a window of 2 GiB), so it is read from the frame's header and taken
from the budget before the decoder is made; what does not fit is `_Refused`, and the footer
is read whole instead, whose own checks decide.
"""

from __future__ import annotations

from collections.abc import Callable

import zstandard

from .codecs import NONE
from .errors import ArrayRecordFormatError
from .varint import MAX_VARINT64_BYTES, read_varint

_PIECE = 1 << 16  # zstd's output, handed on in pieces of this size
_FRAME_HEAD = 18  # a zstd frame header's most bytes
_ZSTD_EXTRA = 1 << 19  # what a zstd stream decoder holds beside its window (block buffers)


class _Refused(Exception):
    """Not a footer this path takes: the caller reads it whole and names what is wrong."""


class _Budget:
    """What streaming may still take of the memory budget; _Refused past it (the footer is
    then read whole, and the whole path's own check decides)."""

    def __init__(self, max_decoded: int) -> None:
        self.left = max_decoded

    def take(self, n: int) -> None:
        if n > self.left:
            raise _Refused
        self.left -= n

    def give(self, n: int) -> None:
        self.left += n


class _FirstVarint:
    """The first varint of a stream (the metadata record's size)."""

    def __init__(self) -> None:
        self.head = b""
        self.value: int | None = None

    def feed(self, piece) -> int:
        """Take the varint's bytes from `piece`; how many it took."""
        if self.value is not None:
            return 0
        had = len(self.head)
        self.head += bytes(piece[: MAX_VARINT64_BYTES - had])
        try:
            self.value, used = read_varint(self.head, 0)
        except ArrayRecordFormatError:
            if len(self.head) >= MAX_VARINT64_BYTES:
                raise _Refused from None
            return len(self.head) - had
        return used - had


class _Block:
    """One block of a simple chunk (`length` stored bytes), decoded as it arrives and handed
    on to `sink` in order: `at_least` to `at_most` decoded bytes, exactly `at_most` with
    `exact`. A zstd block is `varint(decoded length) || frame`; its decoder's window (the
    frame header's, or the content size it declares where that is less) is taken from
    `budget` before the decoder is made, and given back by `close`."""

    def __init__(self, codec: int, length: int, at_least: int, at_most: int,
                 sink: Callable[[memoryview], object], exact: bool = False, *,
                 budget: _Budget) -> None:
        self.codec, self.sink, self.budget = codec, sink, budget
        self.at_least, self.at_most = (at_most if exact else at_least), at_most
        self.prefix = b""
        self.declared: int | None = length if codec == NONE else None
        self.out = 0
        self.held = 0
        self.writer: zstandard.ZstdDecompressionWriter | None = None

    def feed(self, piece) -> None:
        if self.codec == NONE:
            self.write(piece)
            return
        if self.writer is None:
            taken = MAX_VARINT64_BYTES + _FRAME_HEAD - len(self.prefix)
            self.prefix += bytes(piece[:taken])
            frame = self._frame()
            if frame is None:
                return
            self._start(frame)
            piece = memoryview(piece)[taken:]
        try:
            self.writer.write(piece)  # type: ignore[union-attr]
        except zstandard.ZstdError:
            raise _Refused from None

    def _frame(self) -> bytes | None:
        """The frame's first bytes once the varint and the frame header are in `prefix`."""
        try:
            self.declared, used = read_varint(self.prefix, 0)
        except ArrayRecordFormatError:
            if len(self.prefix) >= MAX_VARINT64_BYTES:
                raise _Refused from None
            return None
        if not self.at_least <= self.declared <= self.at_most:
            raise _Refused
        frame = self.prefix[used:]
        try:
            params = zstandard.get_frame_parameters(frame)
        except zstandard.ZstdError:
            if len(self.prefix) >= MAX_VARINT64_BYTES + _FRAME_HEAD:
                raise _Refused from None
            return None
        unknown = params.content_size >= 1 << 63  # (ZSTD_CONTENTSIZE_UNKNOWN)
        if not unknown and params.content_size != self.declared:
            raise _Refused
        # a decoder holds the window, or the content where the frame declares it less
        window = params.window_size if unknown else min(params.window_size, self.declared)
        self.held = window + _ZSTD_EXTRA
        self.budget.take(self.held)
        self.window = max(params.window_size, 1 << 10)
        return frame

    def _start(self, frame: bytes) -> None:
        # one decoder a block: a decompressor is not to be shared between threads
        zstd = zstandard.ZstdDecompressor(max_window_size=self.window)
        self.writer = zstd.stream_writer(self, write_size=_PIECE)  # type: ignore[arg-type]
        try:
            self.writer.write(frame)
        except zstandard.ZstdError:
            raise _Refused from None

    def close(self) -> None:
        """Let go of the decoder and give its window back to the budget."""
        self.writer = None
        self.budget.give(self.held)
        self.held = 0

    def write(self, data) -> int:
        """(The stream writer's output.)"""
        self.out += len(data)
        if self.declared is None or self.out > self.declared:
            raise _Refused
        self.sink(memoryview(data))
        return len(data)

    def finish(self) -> None:
        if self.declared is None or self.out != self.declared or \
                not self.at_least <= self.out <= self.at_most:
            raise _Refused
