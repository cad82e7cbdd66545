"""The Ray cluster this process's loaders share when the user started none (`CLUSTER`), and
the one import of ray (`_ray`, with the error naming the extra when it is missing).

With `ray.init()` called by the user, their cluster runs the actors and is theirs to shut
down. Without, the first Ray executor to start starts a local one (or connects to
`address`), and the last to close shuts it down: two loaders open at once (training and
evaluation) share it, and neither pulls it from under the other. One thread of its own
starts and stops it: Ray's shutdown run on another thread than `ray.init`'s leaves the
driver unable to reach the cluster, and it exits the process a minute later. Ray warns
from that thread that it set no SIGTERM handler (it sets one only from the main thread,
to exit on SIGTERM): this process keeps its own, so the warning is left out (`_Quiet`).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any

from ..errors import MissingExtraError

__all__ = ["CLUSTER", "import_ray"]


def import_ray() -> Any:
    """The ray module, or the error naming the extra that brings it."""
    try:
        import ray
    except ImportError as exc:
        raise MissingExtraError("ray", 'executor="ray"', exc.name) from None
    return ray


class _Cluster:
    """The local (or `address`) cluster of this process's Ray executors, kept by one thread
    from the first `join` to the last `leave`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def join(self, options: dict[str, Any]) -> bool:
        """Whether the caller joined this cluster (started now with `ray.init(**options)` if
        need be: `leave` it at close), or uses the user's (False: `ray.init` was theirs)."""
        ray = import_ray()
        with self._lock:
            if self._thread is None:
                if ray.is_initialized():
                    return False
                started: Future = Future()
                self._done.clear()
                thread = threading.Thread(target=self._keep, args=(options, started),
                                          name="aioloader-ray-cluster", daemon=True)
                thread.start()
                try:
                    started.result()
                except BaseException:
                    thread.join()
                    raise
                self._thread = thread
            self._users += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users or self._thread is None:
                return
            thread, self._thread = self._thread, None
            self._done.set()
        thread.join()

    def _keep(self, options: dict[str, Any], started: Future) -> None:
        ray = import_ray()
        quiet, said = _Quiet(), logging.getLogger("ray._private.worker")
        said.addFilter(quiet)
        try:
            ray.init(**options)
        except BaseException as exc:
            started.set_exception(exc)
            return
        finally:
            said.removeFilter(quiet)
        started.set_result(None)
        self._done.wait()
        ray.shutdown()


class _Quiet(logging.Filter):
    """Leaves out Ray's warning that `ray.init` off the main thread sets no SIGTERM handler
    (the loader's cluster starts on a thread of its own by design)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("SIGTERM handler is not set")


CLUSTER = _Cluster()
