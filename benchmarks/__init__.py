"""Benchmarks: aioloader against its peers (array_record, Grain), side by side in one run.

Run `python -m benchmarks run [--quick] [--only NAME]`; the protocol (ratios measured in the same
run, alternating runs, min/median/max over repeats) is in `benchmarks/common.py`.
"""

import os

# gcsfs imported with its experimental HNS support on (its default) stalls every call against
# the emulator; aioloader.testing no longer sets this on import, so the benchmarks do.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# A figure is of a dataset's first open unless its row says otherwise: no default index cache
# (`index_cache_dir="auto"` keeps remote datasets' footers in ~/.cache, so a repeat would open
# from it where the peers read every footer again). bench_files' `bucket-cached` row sets it.
os.environ.setdefault("AIOLOADER_INDEX_CACHE", "off")
