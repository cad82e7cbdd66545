"""Elastic resume as several jax processes would run it, in one test process: each process
is told its place by patching `aioloader.jax.process_shard` (no `jax.distributed`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def elastic_ids(monkeypatch: Any, make: Callable[[int], Any], *, before: int = 2,
                after: int = 3, stop: int = 3) -> list:
    """Every id `make(procs)`'s loaders yield when `before` processes stop after `stop`
    steps and `after` processes resume from process 0's state to the end of the epoch."""
    import aioloader.jax as aljax

    def run(procs: int, state: Any = None, stop: int | None = None) -> tuple[list, Any]:
        ds = make(procs)
        seen, states = [], []
        for p in range(procs):
            monkeypatch.setattr(aljax, "process_shard", lambda ds, p=p: (p, procs))
            it = ds.loader(workers=0, state=state)
            for k, b in enumerate(it):
                seen += np.asarray(b).tolist()
                if stop is not None and k + 1 == stop:
                    break
            states.append(it.get_state())
            it.close()
        return seen, states[0]

    first, state = run(before, stop=stop)
    rest, _ = run(after, state=state)
    return first + rest


def resumed(ds: Any, at: int) -> tuple[list, list, dict]:
    """(every batch of one workers=0 run, the batches a workers=2 loader gives from the state
    saved after batch `at` (through JSON, as a checkpoint keeps it), that state)."""
    import json

    it = ds.loader(workers=0)
    whole, state = [], None
    for k, b in enumerate(it):
        whole.append(np.asarray(b).tolist())
        if k == at:
            state = json.loads(json.dumps(it.get_state()))
    it.close()
    assert state is not None, f"the run ended before batch {at}"
    rest = [np.asarray(b).tolist() for b in ds.loader(workers=2, state=state)]
    return whole, rest, state
