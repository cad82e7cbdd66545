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
