"""Where tasks run: processes or threads (with workers=0, one thread) that turn a task's
chunks into its output, and what they exchange.

- `messages`: what the parent and a worker exchange (`Pipeline`, `Task`, `Result`);
- `worker`: what a worker process runs; `decode`: its chunk decoder and cache;
- `executor`: the one interface the runtime knows (`Executor`: run a task, close, figures)
  and what its implementations share; `kinds`: what `executor=` names, and
  `open_executor`, which opens one;
- `pool`: the process pool, the parent's side, which sends tasks and hands results on;
  `inline`: workers=0, tasks on one thread of this process; `threads`: the "threads"
  executor, tasks on several threads of this process; `procs`: how the pool's
  processes start (the worker server, `server`, started with the first loader or by
  `aioloader.warm_up()`) and stop; `ray`: tasks on Ray actors (the only module that
  imports ray);
- `arena`: the shared-memory slots results (and remote inputs) travel through;
- `localfiles`, `semnames`: the worker's file reader, and the named-semaphore clean-up the
  pool needs.

The names below are loaded on first use, so that a worker process, which imports
`aioloader.workers.worker` through this package, does not load the parent's side (the pool,
asyncio, concurrent.futures): a worker's start-up is the first batch's wait.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import WorkerError
    from .executor import CLOSE_GRACE_S, Executor
    from .kinds import ExecutorKind, open_executor
    from .localfiles import LocalFiles
    from .messages import Pipeline, Result, Task
    from .pool import Pool

__all__ = ["CLOSE_GRACE_S", "Executor", "ExecutorKind", "LocalFiles", "Pipeline", "Pool",
           "Result", "Task", "WorkerError", "open_executor"]

_HOMES = {"CLOSE_GRACE_S": ".executor", "Executor": ".executor", "Pool": ".pool",
          "open_executor": ".kinds", "ExecutorKind": ".kinds", "LocalFiles": ".localfiles",
          "Pipeline": ".messages", "Result": ".messages", "Task": ".messages",
          "WorkerError": "..errors"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
