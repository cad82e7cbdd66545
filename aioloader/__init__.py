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
from .transforms import Filter, FlatMap, Map, RandomMap
from .typed import ElementSpec

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
]
