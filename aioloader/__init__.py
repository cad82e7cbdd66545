"""aioloader: an asyncio-native streaming data loader for JAX, over ArrayRecord files.

Only the public names live here; see DESIGN.md for the layers behind them.
"""

import os as _os
from typing import TYPE_CHECKING

# A worker process (started from the pool's forkserver, which sets this) loads only what
# it uses: its start-up is the first batch's wait. Everywhere else the package loads whole.
_WORKER_ENV = "_AIOLOADER_WORKER_PROCESS"  # (aioloader.workers.procs.WORKER_ENV)

if TYPE_CHECKING or _os.environ.get(_WORKER_ENV) != "1":
    # First: the workers' forkserver loads while the rest of the package does (~10 ms here).
    from .workers.procs import start_early

    start_early()

    from .arrayrecord import ArrayRecordWriter
    from .dataset import Dataset
    from .errors import (
        ArrayRecordFormatError,
        CollateError,
        ConvertError,
        ElementSpecError,
        MissingExtraError,
        ObjectChangedError,
        StateError,
        StorageError,
        StoreUnavailableError,
        TransformError,
        WorkerError,
    )
    from .options import LoaderOptions, PrefetchOptions, ReadOptions, WorkerOptions
    from .retry import RetryPolicy
    from .runtime.loader import Loader
    from .source import ArrayRecordSource
    from .state import merge_states
    from .transforms import Filter, FlatMap, Map, RandomMap
    from .typed import ElementSpec
else:
    def __getattr__(name: str) -> object:
        """A public name, loaded on first use (in a worker process)."""
        import importlib

        if name in __all__:
            for home in (".errors", ".transforms", ".arrayrecord", ".options", ".retry",
                         ".dataset", ".runtime.loader", ".source", ".state", ".typed"):
                module = importlib.import_module(home, __name__)
                if hasattr(module, name):
                    globals()[name] = value = getattr(module, name)
                    return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# The one place the version is written: the build reads it (pyproject's tool.setuptools.dynamic).
__version__ = "0.1.0"

__all__ = [
    "ArrayRecordFormatError",
    "ArrayRecordSource",
    "ArrayRecordWriter",
    "CollateError",
    "ConvertError",
    "Dataset",
    "ElementSpec",
    "ElementSpecError",
    "Filter",
    "FlatMap",
    "Loader",
    "LoaderOptions",
    "Map",
    "MissingExtraError",
    "ObjectChangedError",
    "PrefetchOptions",
    "RandomMap",
    "ReadOptions",
    "RetryPolicy",
    "StateError",
    "StorageError",
    "StoreUnavailableError",
    "TransformError",
    "WorkerError",
    "WorkerOptions",
    "__version__",
    "merge_states",
]
