"""The decode pool: processes (or, with workers=0, one thread) that turn a task's chunks into
its output, and what they exchange.

- `worker`: what a worker process receives, runs and returns (the messages, its code);
- `pool`: the parent's side, which sends tasks and hands results on;
- `arena`: the shared-memory slots results (and remote inputs) travel through;
- `localfiles`, `inline`, `semnames`: the worker's file reader, the workers=0 executor, and
  the named-semaphore clean-up the pool needs.
"""

from .localfiles import LocalFiles
from .pool import CLOSE_GRACE_S, Pool
from .worker import Pipeline, Result, Task, WorkerError

__all__ = ["CLOSE_GRACE_S", "LocalFiles", "Pipeline", "Pool", "Result", "Task", "WorkerError"]
