"""Transforms for tests/workers/test_first_in_parent.py whose module holds up a worker
process's start: imported in a worker (which unpickles the pipeline, and so imports this
module, before it takes a task), it waits until the file named by `HOLD_ENV` exists, so a
test decides when the pool's workers come up. The process that made the loader (its pid is
in `HOLD_PID_ENV`) and any process without the variables are not held."""

from __future__ import annotations

import json
import os
import time

import numpy as np

HOLD_ENV = "AIOLOADER_TEST_HOLD_WORKERS"  # the file whose existence lets workers start
HOLD_PID_ENV = "AIOLOADER_TEST_HOLD_PARENT"  # the process not to hold
HOLD_MAX_S = 30.0  # never held longer than this (a test that forgot to release)


def _hold() -> None:
    gate = os.environ.get(HOLD_ENV)
    if not gate or os.environ.get(HOLD_PID_ENV) == str(os.getpid()):
        return
    deadline = time.monotonic() + HOLD_MAX_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


_hold()


def decode(record: bytes) -> dict:
    item = json.loads(record)
    return {"id": np.int64(item["id"]), "tokens": np.asarray(item["tokens"], dtype=np.int32)}


def where(element: dict) -> dict:
    """The element's id, and the process that ran this transform."""
    return {"id": element["id"], "pid": np.int64(os.getpid())}


def fail_on_3(element: dict) -> dict:
    if int(element["id"]) == 3:
        raise ValueError("three is unlucky")
    return element
