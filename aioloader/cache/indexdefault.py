"""Which index cache a source uses: the directory it was given, none, or by default
(`index_cache_dir="auto"`) a bounded one in the user's cache directory for gs:// datasets.

Opening a dataset from a bucket costs a request per file (its footer); an index cache entry
turns a later open into the listing alone, so a job restarted on the same files starts as
fast with 2,000 files as with 10. That holds where the listing proves each object's content:
gs:// gives every object version its own generation, and the entry is keyed by them. Other
stores' listings may give only an mtime (seconds, on some), so an entry would have to read
each footer's head again to be safe, or could serve a rewrite of the same size within the
same second: they, and local files (whose footers come from the page cache), are not cached
by default; `index_cache_dir=` a directory caches them, checking those heads.

The default directory is `$AIOLOADER_INDEX_CACHE` when that names one (`off`: no default
cache), else `$XDG_CACHE_HOME/aioloader/index`, else `~/.cache/aioloader/index`. Its entries
take at most `DEFAULT_INDEX_CACHE_BYTES` (the least recently used go first). A default
directory that cannot be made, or that others can write to, means no cache (said at debug
level), never an error: the user did not ask for it. A directory the user names is checked
as before (`IndexCache`: a `PermissionError` if unsafe) and not bounded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Literal

from .index_cache import IndexCache

__all__ = ["AUTO", "DEFAULT_INDEX_CACHE_BYTES", "ENV", "VERSIONED", "default_index_dir",
           "index_cache_for"]

log = logging.getLogger("aioloader")

AUTO = "auto"
ENV = "AIOLOADER_INDEX_CACHE"
DEFAULT_INDEX_CACHE_BYTES = 1 << 30  # ~90M records' entries (12 bytes a record)
VERSIONED = ("gs://", "gcs://")  # stores whose listings give each object version's generation


def default_index_dir() -> str | None:
    """The default index cache's directory, or None (`$AIOLOADER_INDEX_CACHE=off`, or no
    home directory to put it in)."""
    named = os.environ.get(ENV, "").strip()
    if named.lower() == "off":
        return None
    if named and named.lower() != AUTO:
        return named
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):  # (no home: "~" stayed as it was)
        return None
    return os.path.join(base, "aioloader", "index")


def index_cache_for(setting: str | os.PathLike | Literal[False] | None,
                    patterns: Sequence[str]) -> IndexCache | None:
    """The index cache of a source of `patterns` with `index_cache_dir=setting`."""
    if setting is None or setting is False or setting == "":
        return None
    if setting != AUTO:
        return IndexCache(setting)
    if not patterns or not all(p.startswith(VERSIONED) for p in patterns):
        return None
    directory = default_index_dir()
    if directory is None:
        return None
    try:
        return IndexCache(directory, max_bytes=DEFAULT_INDEX_CACHE_BYTES)
    except OSError as err:  # (PermissionError included: someone else can write there)
        log.debug("no index cache: the default directory %s is not usable: %s", directory, err)
        return None
