"""Types of the C extension `_onerecords.c` (one-record chunks in one loop)."""

from collections.abc import Callable
from typing import Any

def read_chunks(fds: list[int], file: list[int], start: list[int], end: list[int],
                within: list[int], counts: list[int] | None, budget: int, hashes: bool,
                data_hashes: bool, heads: dict[int, bytes], decompress: Callable[..., bytes],
                ratio: int, most: int, into: Any, /) -> list[Any]: ...
