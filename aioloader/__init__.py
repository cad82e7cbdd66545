"""aioloader: an asyncio-native streaming data loader for JAX, over ArrayRecord files.

Only the public names live here; see DESIGN.md for the layers behind them.

Importing the package is quiet: it starts no process and loads none of its modules. Each
public name loads its home module on first use (PEP 562: `__getattr__` below), so describing
a pipeline loads only the description's modules; the runtime, storage and worker pool load
when a loader starts, and the worker server (`aioloader.workers.server`) starts with the
first loader that has workers, or earlier with `warm_up()`. A worker process, which imports
this package through its transforms, so loads only what it uses too.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .arrayrecord import ArrayRecordWriter
    from .describe.dataset import Dataset
    from .describe.state import merge_states
    from .elements.transforms import Filter, FlatMap, Map, RandomMap
    from .elements.typed import ElementSpec
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
    from .formats.parquet.errors import ParquetFormatError
    from .formats.tfrecord import TFRecordFormatError
    from .options import (
        LoaderOptions,
        PrefetchOptions,
        ReadOptions,
        RetryPolicy,
        WorkerOptions,
    )
    from .runtime.loader import Loader
    from .runtime.warmup import warm_up
    from .source import ArrayRecordSource, ParquetSource, TFRecordSource
    from .workers.ray import RayExecutor

from ._moved import install as _install_moved

_install_moved()  # old module paths (`aioloader.storage`) still import, with a warning

# The one place the version is written: the build reads it (pyproject's tool.setuptools.dynamic).
__version__ = "0.1.0"

# Each public name and the module it lives in (relative to this package).
_HOMES = {
    **dict.fromkeys(["ArrayRecordFormatError", "CollateError", "ConvertError",
                     "ElementSpecError", "MissingExtraError", "ObjectChangedError",
                     "StateError", "StorageError", "StoreUnavailableError", "TransformError",
                     "WorkerError"], ".errors"),
    **dict.fromkeys(["LoaderOptions", "PrefetchOptions", "ReadOptions", "RetryPolicy",
                     "WorkerOptions"], ".options"),
    **dict.fromkeys(["Filter", "FlatMap", "Map", "RandomMap"], ".elements.transforms"),
    "ArrayRecordSource": ".source",
    "TFRecordSource": ".source",
    "ParquetSource": ".source",
    "TFRecordFormatError": ".formats.tfrecord",
    "ParquetFormatError": ".formats.parquet.errors",
    "ArrayRecordWriter": ".arrayrecord",
    "Dataset": ".describe.dataset",
    "ElementSpec": ".elements.typed",
    "Loader": ".runtime.loader",
    "RayExecutor": ".workers.ray",
    "merge_states": ".describe.state",
    "warm_up": ".runtime.warmup",
}

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
    "ParquetFormatError",
    "ParquetSource",
    "PrefetchOptions",
    "RandomMap",
    "RayExecutor",
    "ReadOptions",
    "RetryPolicy",
    "StateError",
    "StorageError",
    "StoreUnavailableError",
    "TFRecordFormatError",
    "TFRecordSource",
    "TransformError",
    "WorkerError",
    "WorkerOptions",
    "__version__",
    "merge_states",
    "warm_up",
]


if not TYPE_CHECKING:  # (a type checker sees the names above, and flags a misspelt one)

    def __getattr__(name: str) -> object:
        """A public name, loaded from its home on first use; or a submodule (`aioloader.jax`),
        imported on first use as `import aioloader.jax` would."""
        home = _HOMES.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home, __name__), name)
        elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
            value = importlib.import_module(f"{__name__}.{name}")
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
