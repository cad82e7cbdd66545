"""Start importing a client library on a thread before it is first needed.

gcsfs is slow to import (docs/performance.md), and a gs:// glob needs it for its listing.
Started when a pipeline names such files (`Dataset.from_arrayrecord`), the import overlaps
what the program does before the loader opens them (its own imports, setting up a model)
instead of delaying the open. One import per library and process, whoever asks first (the
gs:// backend asks too, for credentials); a failed import is the backend's to report.
"""

from __future__ import annotations

import importlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["import_started"]

_lock = threading.Lock()
_started: dict[str, Future] = {}


def import_started(name: str) -> Future:
    """The import of module `name` on a daemon thread, started now unless it already was."""
    with _lock:
        future = _started.get(name)
        if future is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="aioloader-import")
            future = _started[name] = pool.submit(importlib.import_module, name)
            pool.shutdown(wait=False)
        return future
