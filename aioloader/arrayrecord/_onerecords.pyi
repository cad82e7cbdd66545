"""Types of the C extension `_onerecords.c` (small one-record chunks in one loop)."""

from collections.abc import Callable
from typing import Any

def read_small(fds: list[int], file: list[int], start: list[int], end: list[int],
               within: list[int], counts: list[int] | None, budget: int, hashes: bool,
               data_hashes: bool, heads: dict[int, bytes], decompress: Callable[..., bytes],
               ratio: int, small: int, into: Any, /) -> list[Any]: ...
