"""The loader's place in the stream, as `Loader` keeps it: `get_state`/`set_state`, a state
resumed on this process's shard, and that shard itself (`shard_by_jax_process()`).

Apart from `loader` because the shard may be learned late: on several JAX processes without
a sharding given to `shard_by_jax_process()`, which rows this process loads is known only
when `to_jax(sharding)` says which processes share a data slice (`aioloader.dataslices`), so
the shape, the fresh state and a state to resume from wait until then (`use_data_slice`),
and the loader refuses to start without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..lanes import to_json as lane_json
from ..plan import Shape, needs_processes, shape, with_lane
from ..state import LoaderState

if TYPE_CHECKING:
    from ..dataset import Dataset
    from ..options import LoaderOptions
    from .output import Run
    from .parts import Parts


class StateKeeping:
    """`Loader`'s state and shard (a mixin: `Loader` owns the parts it names)."""

    dataset: Dataset
    options: LoaderOptions
    _parts: Parts
    _run: Run | None
    _closed: bool
    _shape: Shape
    _state: LoaderState

    def _new_run(self) -> None:
        raise NotImplementedError

    def _init_shard(self, state: Mapping[str, Any] | None) -> None:
        """The shape and fresh state, with this process's shard when it is known already."""
        procs = None
        if needs_processes(self.dataset):
            from ..jax import process_shard

            procs = process_shard(self.dataset)  # None: until to_jax(sharding) says it
        self._slice_unknown = procs is None and needs_processes(self.dataset)
        self._given = state  # applied once the shard is known
        self._prefetch_asked = False  # start_prefetch() before it was
        self._reshape(procs)

    def _reshape(self, procs: tuple[int, int] | None) -> None:
        self._shape = shape(self.dataset, self.options.worker.window, procs)
        self._state = LoaderState(unit=self._shape.unit, pipeline=self._shape.fingerprint,
                                  process_count=self._shape.process_count)

    def _check_shard(self) -> None:
        """Refuse to start while the shard is unknown (several processes, no sharding)."""
        if self._slice_unknown:
            from ..dataslices import unknown_layout_error
            from ..jax import process_index_and_count

            raise unknown_layout_error(process_index_and_count()[1])

    @property
    def process_count(self) -> int:
        """The shard count of shard_by_jax_process() (data slices; 1 without it)."""
        return self._shape.process_count

    @property
    def data_slice(self) -> tuple[int, int] | None:
        """shard_by_jax_process()'s `(index, count)` for this process (None without it, or
        while it waits for to_jax's sharding)."""
        return None if self._slice_unknown else self._shape.procs

    def use_data_slice(self, procs: tuple[int, int]) -> None:
        """shard_by_jax_process()'s `(index, count)` from the sharding `to_jax` was given
        (`aioloader.jax.data_slice`), before the first batch."""
        if procs == self._shape.procs:
            return
        if not self._slice_unknown:
            raise ValueError(f"to_jax()'s sharding puts this process in data slice "
                             f"{procs[0]} of {procs[1]}, and shard_by_jax_process()'s in "
                             f"{self._shape.procs}: give both the same sharding")
        self._slice_unknown = False
        self._reshape(procs)
        self._parts.shape = self._shape
        if self._given is not None:
            self._apply_state(self._given)
        if self._prefetch_asked:
            self.start_prefetch()

    def start_prefetch(self) -> None:
        raise NotImplementedError

    def _defer_prefetch(self) -> bool:
        """Whether start_prefetch() must wait for the data slice (it then starts)."""
        self._prefetch_asked = self._slice_unknown
        return self._slice_unknown

    def get_state(self) -> dict[str, Any]:
        """Where the consumer is: JSON-able; pass to `loader(state=...)` to resume exactly."""
        if self._slice_unknown and self._given is not None:
            return dict(self._given)
        return self._state.to_json()

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        if self._slice_unknown:  # applied by use_data_slice
            self._given = state
            return
        sh = self._shape
        new = LoaderState.from_json(state).resume_as(
            sh.fingerprint, sh.unit, sh.process_count, sh.batch_mode,
            process_index=sh.procs[0] if sh.procs else 0)
        plan = self._parts.plan
        if plan is not None:
            if new.moved or new.lane != plan_lane(plan):
                self._parts.plan = plan = with_lane(plan, self.dataset, new)
                new = self._moved(new)
            new.check_position(plan.length, sh.batch_mode, plan.cuts)
        self._state = new

    def _moved(self, state: LoaderState) -> LoaderState:
        """A state moved to this process count, once its plan made the lanes."""
        if not state.moved:
            return state
        return dataclasses.replace(state, lane=plan_lane(self._parts.plan))

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from `state` (from `get_state()`); restarts work in progress."""
        self._apply_state(state)
        if self._run is not None and not self._closed:
            old, self._run = self._run, None
            for t in old.scheduler.cancel():
                t.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._new_run()


def plan_lane(plan: Any) -> Any:
    """The plan's lanes as a state holds them (None: the process's own shard)."""
    return None if plan is None or plan.lane is None else lane_json(plan.lane)
