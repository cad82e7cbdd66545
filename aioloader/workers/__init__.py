"""The decode pool: processes (or, with workers=0, one thread) that turn a task's chunks into
its output, and what they exchange.

- `messages`: what the parent and a worker exchange (`Pipeline`, `Task`, `Result`);
- `worker`: what a worker process runs; `decode`: its chunk decoder and cache;
- `pool`: the parent's side, which sends tasks and hands results on;
- `arena`: the shared-memory slots results (and remote inputs) travel through;
- `localfiles`, `inline`, `semnames`: the worker's file reader, the workers=0 executor, and
  the named-semaphore clean-up the pool needs.
"""

from ..errors import WorkerError
from .localfiles import LocalFiles
from .messages import Pipeline, Result, Task
from .pool import CLOSE_GRACE_S, Pool

__all__ = ["CLOSE_GRACE_S", "LocalFiles", "Pipeline", "Pool", "Result", "Task", "WorkerError"]
