"""Transforms for tests/workers/test_worker_start.py (worker processes import them by name): what a
worker process has loaded, and a record op defined with the package's own base class."""

from __future__ import annotations

import os
import sys

import numpy as np

import aioloader as al


def loaded(record: bytes) -> dict:
    """Which parts of the package (and of the standard library) this process has loaded."""
    return {"pid": np.int64(os.getpid()),
            "parent_side": np.bool_(any(m in sys.modules for m in (
                "aioloader.describe.dataset", "aioloader.runtime.loader",
                "aioloader.workers.pool"))),
            "asyncio": np.bool_("asyncio" in sys.modules)}


class Length(al.Map):
    """A record op subclassing the public `Map` (resolved lazily in a worker process)."""

    def map(self, element: bytes) -> np.int64:
        return np.int64(len(element))


def drifting(record: bytes) -> dict:
    """A big record with a number that is an int in early records and a float in later ones:
    pieces of a batch collate it to different dtypes (the batch must be made whole)."""
    x = np.frombuffer(record, dtype=np.uint8)
    return {"x": x, "y": 1 if x[0] < 128 else 1.5}


def env_value(record: bytes) -> np.int64:
    """AIOLOADER_TEST_ENV as this process sees it (0 if unset)."""
    return np.int64(int(os.environ.get("AIOLOADER_TEST_ENV", "0")))
