"""Suite-wide setup: gcsfs import order, no default index cache, and a leak check after
every test.

GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false is set first so that gcsfs, whenever a test imports it,
exports its plain filesystem (read at gcsfs import; the experimental one stalls every call
against the emulator probing a gRPC API). `aioloader.testing` leaves os.environ alone.

The leak check fails a test that leaves behind a thread, a child process, a TCP socket, a
/dev/shm segment or a memory file (memfd) that it did not have before — closing must release
everything.

Time in tests: the suite runs on shared, loaded 2-core machines, so no test asserts how fast
something is on its own. Wall time appears only as a lower bound a deliberate delay
guarantees, as finishing well before a deliberately long stall or timeout set in the same
test (what a broken path would wait out), or as a hang guard; what happened is asserted by
counts (requests, retries, hedges). Speed claims are ratios against a control in the same
test, or belong to benchmarks/.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading

# Four CPU devices for the in-process JAX tests (meshes with 'data' and 'model' axes);
# must be set before jax is first imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# No default index cache in the user's cache directory: a test that opens files counts
# their requests, and must not find entries another test (or run) left there. The tests
# of the default itself (tests/cache/test_index_cache_default.py) set it per test.
os.environ["AIOLOADER_INDEX_CACHE"] = "off"
import time
import warnings

import psutil
import pytest

import aioloader.testing  # noqa: F401

from .support.procs import worker_pids


def _shm() -> set[str]:
    """Our shared-memory arenas (named after this pid: other processes on the machine, e.g.
    a benchmark run, have their own)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"aioloader-{os.getpid()}-")}
    except OSError:
        return set()


def _memory_files() -> set[str]:
    """Our memory files (memfd arenas and resident copies) this process still holds open or
    mapped, by inode: closing must drop them, or their memory lives as long as the process."""
    out = set()
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as f:
            out |= {ln.split()[4] for ln in f if "memfd:aioloader" in ln}
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if "memfd:aioloader" in os.readlink(f"/proc/self/fd/{fd}"):
                    out.add(str(os.stat(f"/proc/self/fd/{fd}").st_ino))
    return out


def _sockets() -> set[tuple]:
    try:
        conns = psutil.Process().net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {(c.fd, c.laddr, c.raddr) for c in conns if c.status != psutil.CONN_TIME_WAIT}


def _children(me: psutil.Process) -> set[int]:
    return worker_pids(me)  # multiprocessing's resource tracker and forkserver excluded


# fsspec runs one process-wide IO loop thread for its sync wrappers (used by the tests'
# own LocalGCS.fs() helper and by writes to gs:// URLs), and gcsfs one that closes the sessions
# of its cached sync filesystems; both are theirs, started once, and never ours to stop.
_FOREIGN_THREADS = {"fsspecIO", "gcsfs-deferred-close"}


def _snapshot() -> dict[str, set]:
    me = psutil.Process()
    return {
        "threads": {t.ident for t in threading.enumerate() if t.name not in _FOREIGN_THREADS},
        "children": _children(me),
        "shm": _shm(),
        "memfd": _memory_files(),
        "sockets": _sockets(),
    }


def _sigint() -> tuple[str, bool]:
    return (repr(signal.getsignal(signal.SIGINT)),
            signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.fixture(autouse=True)
def sigint_left_alone():
    """Warn, naming the test, when a test leaves SIGINT's handler or mask changed in this
    process (children inherit a blocked or ignored SIGINT: CI once had every Ctrl-C test of
    one xdist worker hang)."""
    before = _sigint()
    yield
    after = _sigint()
    if after != before:
        warnings.warn(f"this test left SIGINT changed: (handler, blocked) {before} -> {after}",
                      stacklevel=1)


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail the test if it leaves threads, processes, sockets or shm segments behind."""
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    before = _snapshot()
    yield
    deadline = time.monotonic() + 10.0  # polled: only a leak waits it out
    while True:
        after = _snapshot()
        extra = {k: after[k] - before[k] for k in after}
        if not any(extra.values()) or time.monotonic() > deadline:
            break
        # A closed loader's memory stays mapped while views of it (batches) are alive, and
        # a dataset's random access (aioloader.runtime.access) is open while the dataset is: a
        # test's traceback or a loader's reference cycle can hold them until a collection.
        # What is still reachable after one is a leak.
        gc.collect()
        time.sleep(0.05)
    if any(extra.values()):
        names = [t.name for t in threading.enumerate() if t.ident in extra["threads"]]
        pytest.fail(f"resources left behind: threads={names}, children={extra['children']}, "
                    f"shm={extra['shm']}, memfd={extra['memfd']}, sockets={extra['sockets']}")


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_leaks: skip the leak check for this test")
