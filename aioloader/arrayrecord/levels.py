"""What a reader checks and the most a chunk may decode to: the reading settings every layer
names (the verify levels, the decode cap). Apart from `chunk`, which applies them, so that
describing a pipeline names them without loading the codecs."""

from __future__ import annotations

VERIFY_LEVELS = ("none", "headers", "all")
"""What a reader checks, the `verify=` option: "all" (the default) every stored hash, as
Google's reader does: block headers, chunk headers and each chunk's data, so a record whose
bytes changed is an error, never wrong data; "headers" only the headers, which keeps a damaged
file's structure (sizes, counts, offsets) from being misread but returns records with flipped
bits as they are; "none" no hash."""
DEFAULT_VERIFY = "all"

DEFAULT_MAX_DECODED = 1 << 30
"""The most bytes one chunk may decode to unless the caller says otherwise (the loader passes
its memory_budget): a declared size is checked against it before anything is allocated."""
