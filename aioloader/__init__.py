"""aioloader: an asyncio-native streaming data loader for JAX, over ArrayRecord files.

Only the public names live here; see DESIGN.md for the layers behind them.
"""

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
