"""aioloader: an asyncio-native streaming data loader for JAX, over ArrayRecord files.

Only the public names live here; see DESIGN.md for the layers behind them.
"""

from .arrayrecord import ArrayRecordFormatError, ArrayRecordWriter

__version__ = "0.1.0"

__all__ = ["ArrayRecordFormatError", "ArrayRecordWriter", "__version__"]
