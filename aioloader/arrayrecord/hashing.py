"""HighwayHash-64, the hash Riegeli (and so ArrayRecord) uses for every stored checksum.

Riegeli stores a HighwayHash-64 (with a fixed key) of each 24-byte block header, each
40-byte chunk header and each chunk's data, and the official reader rejects a chunk whose
data hash does not match. Header hashes are cheap, but a pure-Python port is far too slow
to verify or write chunk data, so the real work is done by the small C extension
``_highwayhash``: an AVX2 path where the CPU has it, else portable C99; :data:`NATIVE_IMPL`
says which. Checking every chunk's data hash is then cheap enough to be worth doing on
every read (docs/performance.md has the figures). :func:`highwayhash64_py` is the readable
reference that the tests check both against, and the fallback if the extension is missing
(a ``RuntimeWarning`` says so once, at import).

The algorithm follows ``ARRAYRECORD_FORMAT.md`` section 3.1.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["HAVE_NATIVE", "NATIVE_IMPL", "RIEGELI_KEY", "HashStream", "highwayhash64",
           "highwayhash64_pair", "highwayhash64_py"]

#: Riegeli's fixed key: these 32 bytes, read as four little-endian u64.
RIEGELI_KEY = b"Riegeli/records\nRiegeli/records\n"

_MASK64 = 0xFFFFFFFFFFFFFFFF
_MASK32 = 0xFFFFFFFF
_INIT_MUL0 = (0xDBE6D5D5FE4CCE2F, 0xA4093822299F31D0, 0x13198A2E03707344, 0x243F6A8885A308D3)
_INIT_MUL1 = (0x3BD39E10CB0EF593, 0xC0ACF169B5F18A8C, 0xBE5466CF34E90C6C, 0x452821E638D01377)
# Byte indices into le(a) || le(b) that make up the two lanes of a zipper merge.
_ZIPPER_LANE0 = (3, 12, 2, 5, 14, 1, 15, 0)
_ZIPPER_LANE1 = (11, 4, 10, 13, 9, 6, 8, 7)
_FOUR_U64 = struct.Struct("<4Q")
_TWO_U64 = struct.Struct("<2Q")


def _rot32(x: int) -> int:
    """Swap the two 32-bit halves of a u64."""
    return ((x >> 32) | (x << 32)) & _MASK64


def _zipper(a: int, b: int) -> tuple[int, int]:
    """The zipper merge Z(a, b): two u64 picked byte by byte out of le(a) || le(b)."""
    x = _TWO_U64.pack(a, b)
    lane0 = int.from_bytes(bytes(x[i] for i in _ZIPPER_LANE0), "little")
    lane1 = int.from_bytes(bytes(x[i] for i in _ZIPPER_LANE1), "little")
    return lane0, lane1


class _State:
    """The four 4-lane vectors of a HighwayHash computation."""

    def __init__(self, key: tuple[int, int, int, int]) -> None:
        self.mul0 = list(_INIT_MUL0)
        self.mul1 = list(_INIT_MUL1)
        self.v0 = [m ^ k for m, k in zip(_INIT_MUL0, key, strict=True)]
        self.v1 = [m ^ _rot32(k) for m, k in zip(_INIT_MUL1, key, strict=True)]

    def update(self, lanes: tuple[int, ...] | list[int]) -> None:
        v0, v1, mul0, mul1 = self.v0, self.v1, self.mul0, self.mul1
        for i in range(4):
            v1[i] = (v1[i] + mul0[i] + lanes[i]) & _MASK64
            mul0[i] ^= (v1[i] & _MASK32) * (v0[i] >> 32)
            v0[i] = (v0[i] + mul1[i]) & _MASK64
            mul1[i] ^= (v0[i] & _MASK32) * (v1[i] >> 32)
        for dst, src in ((v0, v1), (v1, v0)):  # v0 += Z(v1) first, then v1 += Z(new v0)
            for i in (0, 2):
                z0, z1 = _zipper(src[i], src[i + 1])
                dst[i] = (dst[i] + z0) & _MASK64
                dst[i + 1] = (dst[i + 1] + z1) & _MASK64

    def update_remainder(self, tail: bytes) -> None:
        n = len(tail)  # 1..31
        for i in range(4):
            self.v0[i] = (self.v0[i] + (n << 32) + n) & _MASK64
            x = self.v1[i]
            lo = x & _MASK32
            hi = x >> 32
            lo = ((lo << n) | (lo >> (32 - n))) & _MASK32
            hi = ((hi << n) | (hi >> (32 - n))) & _MASK32
            self.v1[i] = (hi << 32) | lo
        packet = bytearray(32)
        whole = n & ~3
        packet[:whole] = tail[:whole]
        if n & 16:
            packet[28:32] = tail[-4:]
        else:
            m = n & 3
            if m:
                t = tail[whole:]
                packet[16] = t[0]
                packet[17] = t[m >> 1]
                packet[18] = t[m - 1]
        self.update(_FOUR_U64.unpack(packet))

    def finalize64(self) -> int:
        for _ in range(4):
            v0 = self.v0
            self.update([_rot32(v0[2]), _rot32(v0[3]), _rot32(v0[0]), _rot32(v0[1])])
        return (self.v0[0] + self.v1[0] + self.mul0[0] + self.mul1[0]) & _MASK64


def _contiguous_bytes(data: Buffer, what: str) -> bytes:
    view = memoryview(data)
    if not view.c_contiguous:
        raise BufferError(f"{what} must be a C-contiguous buffer")
    return view.tobytes()


def highwayhash64_py(data: Buffer, key: Buffer = RIEGELI_KEY) -> int:
    """HighwayHash-64 of ``data`` with a 32-byte ``key``, in pure Python (slow: the reference).

    ``data`` may be any C-contiguous buffer; its raw bytes are hashed.
    """
    key_bytes = _contiguous_bytes(key, "key")
    if len(key_bytes) != 32:
        raise ValueError(f"key must be exactly 32 bytes, got {len(key_bytes)}")
    buf = _contiguous_bytes(data, "data")
    state = _State(_FOUR_U64.unpack(key_bytes))
    full = len(buf) - len(buf) % 32
    for lanes in _FOUR_U64.iter_unpack(buf[:full]):
        state.update(lanes)
    if full != len(buf):
        state.update_remainder(buf[full:])
    return state.finalize64()


def _highwayhash64_fallback(data: Buffer) -> int:
    return highwayhash64_py(data, RIEGELI_KEY)


try:
    from . import _highwayhash
except ImportError:  # pragma: no cover - exercised by a test that hides the module
    _highwayhash = None  # type: ignore[assignment]
    warnings.warn(
        "aioloader's C extension for HighwayHash is not built (installed without a C "
        "compiler?): checksums fall back to pure Python at ~3 MB/s, slow. "
        "Install a wheel, or reinstall with a compiler: pip install --no-binary aioloader "
        "--force-reinstall aioloader.",
        RuntimeWarning,
        stacklevel=1,
    )

#: True when the C extension is in use.
HAVE_NATIVE: bool = _highwayhash is not None

#: The extension's implementation chosen for this CPU ("avx2" or "portable"); None without it.
NATIVE_IMPL: str | None = _highwayhash.IMPL if _highwayhash is not None else None

#: ``highwayhash64(data) -> int``: HighwayHash-64 of any C-contiguous buffer with
#: :data:`RIEGELI_KEY`, the value Riegeli stores (as a u64 LE) for headers and chunk data.
#: The C function itself when the extension is built (no wrapper: headers are hashed per
#: record), else the pure-Python reference.
highwayhash64: Callable[[Buffer], int] = (
    _highwayhash.hash64 if _highwayhash is not None else _highwayhash64_fallback
)


def _pair_fallback(a: Buffer, b: Buffer) -> tuple[int, int]:
    return highwayhash64(a), highwayhash64(b)


#: ``highwayhash64_pair(a, b) -> (highwayhash64(a), highwayhash64(b))``, the two computed in
#: lockstep by the C extension: one hash is a chain of dependent steps that leaves most of a
#: core idle, two fill it (more bytes per second with AVX2; the same as two calls
#: elsewhere). For callers that check many chunks' data hashes (the workers).
highwayhash64_pair: Callable[[Buffer, Buffer], tuple[int, int]] = (
    _highwayhash.hash64_pair if _highwayhash is not None else _pair_fallback
)


class HashStream:
    """`highwayhash64` of data fed in pieces (`update`, then `digest`), for a footer read in
    windows; needs the C extension (`HashStream.available`). `impl` names one of the
    extension's implementations (its `IMPLS`), for the tests; None: the one in use."""

    __slots__ = ("_impl", "_state", "_tail")
    available: bool = _highwayhash is not None and hasattr(_highwayhash, "hash64_update")

    def __init__(self, impl: str | None = None) -> None:
        self._impl = impl
        self._state = bytearray(128)  # all zero: the extension starts it with Riegeli's key
        self._tail = b""  # under 32 bytes, not yet a whole packet

    def update(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        if self._tail:
            need = 32 - len(self._tail)
            self._tail += bytes(view[:need])
            view = view[need:]
            if len(self._tail) < 32:
                return
            _highwayhash.hash64_update(self._state, self._tail, self._impl)
            self._tail = b""
        whole = len(view) - len(view) % 32
        if whole:
            _highwayhash.hash64_update(self._state, view[:whole], self._impl)
        self._tail = bytes(view[whole:])

    def digest(self) -> int:
        return _highwayhash.hash64_final(self._state, self._tail)
