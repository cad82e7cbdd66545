"""The worker server: aioloader's own forkserver, of which every worker process is a fork,
and the worker processes it starts, which never import the user's `__main__`.

multiprocessing starts a child by sending it "preparation data" that names the parent's
`__main__` (its file, or its module for `python -m`); the child imports it again as
`__mp_main__`, which runs the whole body of a script without an `if __name__ ==
"__main__":` guard (a second loader in every worker, then multiprocessing's "bootstrapping
phase" error), and fails for `python - < script.py` (no file to import). A worker needs
nothing from `__main__`: transforms and sources travel by cloudpickle, by value when they
live there. So the processes of `context()` are sent that data without `__main__`
(`_Popen._launch`, multiprocessing's own launch with that one change), and the server
imports only `PRELOAD`, never `__main__`.

The server is a `ForkServer` of this module, not multiprocessing's shared one: a user's own
forkserver processes keep their `__main__`, and a forked child starts a server of its own
(the parent's is not reachable from it).

multiprocessing's temporary directory (`pymp-*`, which holds the server's socket) is the
parent's to remove at exit; a parent killed by a signal cannot, so the server, which exits
when its parent has gone, removes its socket and then the directory if nothing else is in it
(`_remove_parent_tmp`).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import threading
import time
import warnings
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.context import set_spawning_popen
from typing import Any

# The mark of the server's environment, which its workers inherit.
WORKER_ENV = "_AIOLOADER_WORKER_PROCESS"
PRELOAD = ["aioloader.workers.server", "aioloader.workers.worker"]  # what the server loads
MAIN_KEYS = ("init_main_from_name", "init_main_from_path", "main_path")  # how a child is told it

_server = forkserver.ForkServer()
_env_lock = threading.Lock()


def _fresh_server_in_child() -> None:
    global _server, _env_lock
    _server = forkserver.ForkServer()  # the parent's: its socket and pipe are not ours
    _env_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_server_in_child)


def preparation_data(name: str) -> dict[str, Any]:
    """What a new worker process is told before it unpickles its process object: the
    parent's (`sys.path`, directory, ...), without `__main__`."""
    data = spawn.get_preparation_data(name)
    for key in MAIN_KEYS:
        data.pop(key, None)
    return data


class _Popen(popen_forkserver.Popen):
    """multiprocessing's forkserver start, from `_server`, without `__main__`."""

    _fds: list[int]  # (the fds the child inherits: `popen_forkserver.Popen`)

    def _launch(self, process_obj: Any) -> None:
        prep_data = preparation_data(process_obj._name)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = _server.connect_to_new_process(self._fds)
        # a duplicate of the data pipe's write end: the child's sentinel of this process
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds,  # type: ignore[attr-defined]
                                       (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class WorkerProcess(mp_context.ForkServerProcess):
    """A process forked by the worker server."""

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:  # type: ignore[override]
        return _Popen(process_obj)


class WorkerContext(mp_context.ForkServerContext):
    """The forkserver start method, with the worker server and `WorkerProcess`."""

    Process = WorkerProcess  # type: ignore[assignment]


def ensure_running() -> None:
    """Start the server (if not running) with `WORKER_ENV` in its environment only: set
    around the start, under a lock (another thread starting a process meanwhile would see it
    too, which only makes `import aioloader` there load lazily)."""
    with _env_lock:
        had = os.environ.get(WORKER_ENV)
        os.environ[WORKER_ENV] = "1"
        try:
            _server.set_forkserver_preload(PRELOAD)
            _server.ensure_running()
        finally:
            if had is None:
                os.environ.pop(WORKER_ENV, None)
            else:
                os.environ[WORKER_ENV] = had


def server_pid() -> int | None:
    """The running server's process id, or None."""
    pid: int | None = getattr(_server, "_forkserver_pid", None)
    return pid


def _remove_parent_tmp(parent: int, me: int) -> None:
    """(In the server, at its exit) Remove the server's socket and, once the parent has gone,
    the parent's `pymp-*` directory where it lies, if nothing else is left there (a forked
    child's server shares its parent's directory). The server exits when the last process
    holding its "alive" pipe closes it, an instant before the parent's children are handed
    to another parent: hence the short wait."""
    # set by the server's main()
    address = getattr(forkserver._forkserver, "_forkserver_address", None)
    if os.getpid() != me or not isinstance(address, str) or not address.startswith("/"):
        return
    with contextlib.suppress(OSError):
        os.unlink(address)
    where = os.path.dirname(address)
    if not os.path.basename(where).startswith("pymp-"):
        return
    deadline = time.monotonic() + 1.0
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.005)
    if os.getppid() != parent:
        with contextlib.suppress(OSError):
            os.rmdir(where)


if os.environ.get(WORKER_ENV) == "1":  # loaded in the server (its workers are its forks)
    atexit.register(_remove_parent_tmp, os.getppid(), os.getpid())
    # The slow-hashing warning (no C extension) is the parent's to give, once: the server and
    # its workers write to the same stderr.
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            module=r"aioloader\.arrayrecord\.hashing")
