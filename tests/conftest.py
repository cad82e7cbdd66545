"""Suite-wide setup.

`aioloader.testing` is imported first so that gcsfs, whenever a test imports it, sees
GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false (read at gcsfs import; otherwise every call against the
emulator stalls probing a gRPC API).
"""

import aioloader.testing  # noqa: F401
