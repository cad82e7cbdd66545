"""The decode pool: processes (or, with workers=0, one thread) that turn a task's chunks into
its output, and what they exchange.

- `messages`: what the parent and a worker exchange (`Pipeline`, `Task`, `Result`);
- `worker`: what a worker process runs; `decode`: its chunk decoder and cache;
- `pool`: the parent's side, which sends tasks and hands results on; `procs`: how its
  processes start (the worker server, `server`, started with the first loader or by
  `aioloader.warm_up()`) and stop;
- `arena`: the shared-memory slots results (and remote inputs) travel through;
- `localfiles`, `inline`, `semnames`: the worker's file reader, the workers=0 executor, and
  the named-semaphore clean-up the pool needs.

The names below are loaded on first use, so that a worker process, which imports
`aioloader.workers.worker` through this package, does not load the parent's side (the pool,
asyncio, concurrent.futures): a worker's start-up is the first batch's wait.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import WorkerError
    from .localfiles import LocalFiles
    from .messages import Pipeline, Result, Task
    from .pool import CLOSE_GRACE_S, Pool

__all__ = ["CLOSE_GRACE_S", "LocalFiles", "Pipeline", "Pool", "Result", "Task", "WorkerError"]

_HOMES = {"CLOSE_GRACE_S": ".pool", "Pool": ".pool", "LocalFiles": ".localfiles",
          "Pipeline": ".messages", "Result": ".messages", "Task": ".messages",
          "WorkerError": "..errors"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
