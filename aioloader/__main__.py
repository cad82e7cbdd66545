"""`python -m aioloader`: the `aioloader` command (`aioloader.tools.cli`)."""

import sys

from .tools.cli import main

sys.exit(main())
