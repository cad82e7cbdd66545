"""Which index cache a source uses: the directory it was given, none, or by default
(`index_cache_dir="auto"`) a bounded one in the user's cache directory for gs:// datasets.

Opening a dataset from a bucket costs a request per file (its footer); an index cache entry
turns a later open into the listing alone, so a job restarted on the same files starts as
fast with 2,000 files as with 10. That holds where the listing proves each object's content:
gs:// gives every object version its own generation, and the entry is keyed by them. Other
stores' listings may give only an mtime (seconds, on some), so an entry would have to read
each footer's head again to be safe, or could serve a rewrite of the same size within the
same second: they, and local files (whose footers come from the page cache), are not cached
by default; `index_cache_dir=` a directory caches them, and a later open checks each file's
footer head (one small read a file) before it trusts the entry (`index_cache.checked`).

The default directory is `$AIOLOADER_INDEX_CACHE` when that names one (an absolute path;
`off`: no default cache), else `$XDG_CACHE_HOME/aioloader/index`, else
`~/.cache/aioloader/index`. Its entries take at most `DEFAULT_INDEX_CACHE_BYTES` (the least
recently used go first). A default directory that cannot be made, or that others can write
to, means no cache, never an error (said at debug level; with a warning where the
environment named it). A directory passed as `index_cache_dir` is checked as before
(`IndexCache`: a `PermissionError` if unsafe) and not bounded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Literal

from ..urls import is_gcs
from .index_cache import IndexCache

__all__ = ["AUTO", "DEFAULT_INDEX_CACHE_BYTES", "ENV", "default_index_dir", "index_cache_for"]

log = logging.getLogger("aioloader")

AUTO = "auto"
ENV = "AIOLOADER_INDEX_CACHE"
DEFAULT_INDEX_CACHE_BYTES = 1 << 30  # ~90M records' entries (12 bytes a record)


def default_index_dir() -> str | None:
    """The default index cache's directory, or None (`$AIOLOADER_INDEX_CACHE=off`, or no
    home directory to put it in, or a relative one named: each process, workers included,
    would find another)."""
    named = _named()
    if named is not None:
        return named or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):  # (no home: "~" stayed as it was)
        return None
    return os.path.join(base, "aioloader", "index")


def _named() -> str | None:
    """What `$AIOLOADER_INDEX_CACHE` says: a directory, "" for none, None for the default."""
    named = os.environ.get(ENV, "").strip()
    if not named or named.lower() == AUTO:
        return None
    if named.lower() == "off":
        return ""
    if not os.path.isabs(named):
        log.warning("no index cache: %s=%r is not an absolute path (give one, or 'off')",
                    ENV, named)
        return ""
    return named


def index_cache_for(setting: str | os.PathLike | Literal[False] | None,
                    patterns: Sequence[str]) -> IndexCache | None:
    """The index cache of a source of `patterns` with `index_cache_dir=setting`."""
    if setting is None or setting is False or setting == "":
        return None
    if setting != AUTO:
        return IndexCache(setting)
    if not patterns or not all(is_gcs(p) for p in patterns):
        return None
    directory = default_index_dir()
    if directory is None:
        return None
    try:
        return IndexCache(directory, max_bytes=DEFAULT_INDEX_CACHE_BYTES)
    except OSError as err:  # (PermissionError included: someone else can write there)
        say = log.warning if _named() else log.debug  # (one the user named: said)
        say("no index cache: the directory %s is not usable: %s", directory, err)
        return None
