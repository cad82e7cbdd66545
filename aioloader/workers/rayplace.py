"""Which of the Ray executor's actors have started (`Placement`): a task goes only to an
actor that has answered once, so an actor the cluster cannot place (too few free CPUs)
holds no task. Those that start go on alone; if none starts in `PLACE_TIMEOUT_S`, the
error says what the actors asked for and what the cluster had free. An answer marks its
actor up as it comes (a callback on Ray's thread), so asking which are up costs no call
into Ray: it is asked for every task."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..errors import WorkerError
from .raycluster import import_ray

__all__ = ["PLACE_TIMEOUT_S", "Placement"]

log = logging.getLogger("aioloader")
PLACE_TIMEOUT_S = 60.0  # for the first actor to start, and before the unplaced are named


class Placement:
    """The actors' first answers (`ready`, each actor's `ready.remote()`), and which came."""

    def __init__(self, num_cpus_per_actor: float) -> None:
        self.num_cpus_per_actor = num_cpus_per_actor
        self.ready: list[Any] = []
        self._up: list[bool] = []
        self._since = time.monotonic()
        self._told = False

    def add(self, ref: Any) -> None:
        self.ready.append(ref)
        self._up.append(False)
        self._when_up(len(self.ready) - 1, ref)

    def reset(self, at: int, ref: Any) -> None:
        """Actor `at` replaced: its new one has yet to answer."""
        self.ready[at], self._up[at] = ref, False
        self._when_up(at, ref)

    def _when_up(self, at: int, ref: Any) -> None:
        """Mark actor `at` up when `ref` (its first answer, or its death) comes."""
        def came(_: Any) -> None:
            ready, up = self.ready, self._up
            if at < len(ready) and ready[at] is ref:  # (not replaced or cleared since)
                up[at] = True

        ref.future().add_done_callback(came)

    def clear(self) -> None:
        self.ready, self._up = [], []

    def all_up(self) -> bool:
        return bool(self._up) and all(self._poll())

    def up(self) -> list[int]:
        """The actors that have answered."""
        return [k for k, u in enumerate(self._poll()) if u]

    def _poll(self) -> list[bool]:
        return self._up

    async def started(self) -> list[int]:
        """The actors that have answered (waiting for one if none has yet)."""
        while True:
            up = self.up()
            if up:
                self._tell(up)
                return up
            left = PLACE_TIMEOUT_S - (time.monotonic() - self._since)
            if left <= 0:
                raise WorkerError(self._unplaced(len(self.ready), "none of"))
            waits = [asyncio.wrap_future(r.future()) for r in self.ready]
            try:
                await asyncio.wait(waits, timeout=min(left, 1.0),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def _tell(self, up: list[int]) -> None:
        if self._told or len(up) == len(self.ready):
            return
        if time.monotonic() - self._since >= PLACE_TIMEOUT_S:
            self._told = True
            log.warning("%s; the loader goes on with the %d that started",
                        self._unplaced(len(self.ready) - len(up), "of"), len(up))

    def _unplaced(self, n: int, which: str) -> str:
        try:
            free = import_ray().available_resources().get("CPU", 0)
        except Exception:
            free = "unknown"
        return (f"{which} the {len(self.ready)} Ray actors, {n} could not be placed in "
                f"{PLACE_TIMEOUT_S:.0f} s: each asks for num_cpus_per_actor="
                f"{self.num_cpus_per_actor} CPUs and the cluster has {free} free; start "
                "fewer workers, lower num_cpus_per_actor, or add nodes")
