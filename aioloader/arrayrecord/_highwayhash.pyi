"""Types of the C extension `_highwayhash.c` (HighwayHash-64 for Riegeli checksums)."""

from typing import Any

from numpy.typing import NDArray
from typing_extensions import Buffer

_Buf = Buffer | NDArray[Any]  # (NumPy's stubs call ndarray a buffer only from 3.12)

IMPL: str
IMPLS: tuple[str, ...]

def hash64(data: _Buf, /) -> int: ...
def hash64_pair(a: _Buf, b: _Buf, /) -> tuple[int, int]: ...
def hash64_key(key32: _Buf, data: _Buf, /) -> int: ...
def hash64_impl(impl: str, key32: _Buf, data: _Buf, /) -> int: ...
