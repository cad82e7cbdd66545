"""`warm_up()`: start, before the first loader is made, what that loader would wait for.

A first loader with workers waits for two things a script can start earlier: the worker
server (a fresh interpreter loading NumPy and the worker's code, `workers.procs`), and this
process's own runtime (the loader, scheduler, storage and asyncio: a few hundred modules),
which `import aioloader` leaves unloaded. `warm_up()` starts the server and imports the
runtime on a daemon thread (`preimport`), so both overlap the script's own set-up (building
a model, restoring a checkpoint). The package's layers import each other without circles
(tests/test_layering.py), so the thread and the script importing the same modules only wait
for each other.
"""

from __future__ import annotations

from ..preimport import import_started
from ..workers.procs import start_server

RUNTIME = "aioloader.runtime.loader"  # what `Dataset.loader()` imports


def warm_up() -> None:
    """Start the worker server and load the loader's modules now, so that the first batch of
    the first loader comes sooner: call it early in a script, before building the model,
    say. Returns at once (the server loads in its own process, the modules on a thread);
    calling it again does nothing. A loader with workers starts the server itself when it is
    made, so without `warm_up()` the first batch waits for it (benchmarks/RESULTS.md)."""
    start_server()
    import_started(RUNTIME)
