"""Types of the C extension `_footer.c` (ArrayRecord footer entries, parsed in C)."""

from collections.abc import Callable
from typing import Any

from numpy.typing import NDArray
from typing_extensions import Buffer

_Buf = Buffer | NDArray[Any]  # (NumPy's stubs call ndarray a buffer only from 3.12)

def entries(values: _Buf, ends: _Buf, offsets: _Buf, decoded: _Buf, records: _Buf, /) -> int: ...
def columns(sizes: _Buf, values: _Buf, footer_offset: int, offsets: _Buf, decoded: _Buf,
            records: _Buf, /) -> tuple[int, int, int, int] | None: ...
def lean_columns(sizes: _Buf, values: _Buf, footer_offset: int, offsets: _Buf, decoded: _Buf,
                 records: _Buf | None, /) -> tuple[int, int, int, int] | None: ...
def stream_entries(values: _Buf, footer_offset: int, offsets: _Buf, decoded: _Buf,
                   records: _Buf | None, state: _Buf, /) -> int: ...
def stream_sizes(sizes: _Buf, offsets: _Buf, decoded: _Buf, records: _Buf | None,
                 state: _Buf, /) -> int: ...
def postscript(head: _Buf, post_at: int, size: int, verify: bool,
               hash64: Callable[[Any], int], /) -> int | None: ...
def small_footer(raw: _Buf, footer_offset: int, have: int, max_decoded: int, verify: bool,
                 hash64: Callable[[Any], int], decompress: Callable[..., Any], /
                 ) -> tuple[bytearray, bytearray, bool, bytearray | None, bytes, bytes, int,
                            int, int] | None: ...
