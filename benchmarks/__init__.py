"""Benchmarks: aioloader against its peers (array_record, Grain), side by side in one run.

Run `python -m benchmarks run [--quick] [--only NAME]`; the protocol (ratios measured in the same
run, alternating runs, min/median/max over repeats) is in `benchmarks/common.py`.
"""

import os

# gcsfs imported with its experimental HNS support on (its default) stalls every call against
# the emulator; aioloader.testing no longer sets this on import, so the benchmarks do.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
