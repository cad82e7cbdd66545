"""The start and end every process of a real multi-process JAX test job shares
(tests/support/multihost_worker.py, tests/support/elastic_stream_worker.py).

    python -m tests.WORKER PORT NUM_PROCESSES PROCESS_ID CONFIG_JSON
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys

import jax
from jax.experimental import multihost_utils


def join() -> tuple[int, dict]:
    """Join the job named on the command line (gloo collectives, a coordinator on
    127.0.0.1:PORT); this process's index and its config."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where it hangs
    port, n, i, cfg_json = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n,
                               process_id=i)
    return i, json.loads(cfg_json)


def leave() -> None:
    """Wait for every process, shut the job down and exit 0, skipping the interpreter's
    teardown: there JAX's CPU client joins its thread pool, and now and then (under load)
    one of its threads is still creating a gloo communicator towards a process that has
    already exited; it waits out gloo's timeout (minutes) and stalls the test. Every result
    is written and synced by now."""
    multihost_utils.sync_global_devices("done")
    jax.distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
