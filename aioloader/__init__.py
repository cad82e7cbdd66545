"""aioloader: an asyncio-native streaming data loader for JAX, over ArrayRecord files.

Only the public names live here; see DESIGN.md for the layers behind them.
"""

from .arrayrecord import ArrayRecordFormatError, ArrayRecordWriter
from .dataset import Dataset
from .runtime.loader import Loader
from .source import ArrayRecordSource
from .state import StateError
from .storage import ObjectChangedError, RetryPolicy, StorageError, StoreUnavailableError
from .transforms import CollateError, TransformError
from .workers import WorkerError

__version__ = "0.1.0"

__all__ = [
    "ArrayRecordFormatError",
    "ArrayRecordSource",
    "ArrayRecordWriter",
    "CollateError",
    "Dataset",
    "Loader",
    "ObjectChangedError",
    "RetryPolicy",
    "StateError",
    "StorageError",
    "StoreUnavailableError",
    "TransformError",
    "WorkerError",
    "__version__",
]
