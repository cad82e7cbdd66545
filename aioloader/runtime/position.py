"""`Position`: the loader's place in the stream — the one owner of its `LoaderState` and of the
plan that runs from it — and this process's shard (`shard_by_jax_process()`).

The state is assigned in one place (`_become`): a fresh one, one resumed (`resume`), and
the state after each item handed out (`hand_out`). The plan depends on the state's window,
layout and lanes, so it is compiled when the files are open (`open`) and again only when a
state set later asks for others; the runtime reads `plan` here rather than keeping copies.

The shard may be learned late: on several JAX processes without a sharding given to
`shard_by_jax_process()`, which rows this process loads is known only when
`to_jax(sharding)` says which processes share a data slice (`aioloader.index.dataslices`), so the
shape, the fresh state and a state to resume from wait until then (`use_data_slice`), and
the loader refuses to start without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..describe.blocksizes import sized, unsized
from ..describe.plan import Plan, SourceMeta, compile, longest_shard, needs_processes, shape
from ..describe.state import LoaderState
from ..index.lanes import to_json as lane_json

if TYPE_CHECKING:
    from ..describe.dataset import Dataset
    from ..options import LoaderOptions


class Position:
    """The state, shape and plan of one loader over `dataset`."""

    def __init__(self, dataset: Dataset, options: LoaderOptions,
                 state: Mapping[str, Any] | None = None) -> None:
        # a block shuffle's unset sizes, from the budgets (a resumed state's: `resume`)
        self.described, self.options = dataset, options
        self.dataset = self._sized()
        self.plan: Plan | None = None  # once the files are open
        self._meta: SourceMeta | None = None
        procs = None
        if needs_processes(dataset):
            from ..jax import process_shard

            procs = process_shard(dataset)  # None: until to_jax(sharding) says it
        self._slice_unknown = procs is None and needs_processes(dataset)
        self._given = state  # applied once the shard is known
        self._reshape(procs)
        if state is not None:
            self.resume(state)

    @property
    def state(self) -> LoaderState:
        """The consumer's place: the state after the last item handed out."""
        return self._state

    def _become(self, state: LoaderState) -> None:
        self._state = state

    def hand_out(self, state: LoaderState) -> None:
        """An item was handed out: `state` is the one after it."""
        self._become(state)

    def _reshape(self, procs: tuple[int, int] | None) -> None:
        self.shape = shape(self.dataset, self.options.worker.window, procs)
        self._become(LoaderState(unit=self.shape.unit, pipeline=self.shape.fingerprint,
                                 process_count=self.shape.process_count))

    # -- the shard ----------------------------------------------------------------------

    def check_shard(self) -> None:
        """Refuse to start while the shard is unknown (several processes, no sharding)."""
        if self._slice_unknown:
            from ..index.dataslices import unknown_layout_error
            from ..jax import process_index_and_count

            raise unknown_layout_error(process_index_and_count()[1])

    @property
    def slice_unknown(self) -> bool:
        return self._slice_unknown

    @property
    def data_slice(self) -> tuple[int, int] | None:
        return None if self._slice_unknown else self.shape.procs

    def use_data_slice(self, procs: tuple[int, int]) -> bool:
        """The data slice from `to_jax`'s sharding; whether it was learned now."""
        if procs == self.shape.procs:
            return False
        if not self._slice_unknown:
            raise ValueError(f"to_jax()'s sharding puts this process in data slice "
                             f"{procs[0]} of {procs[1]}, and shard_by_jax_process()'s in "
                             f"{self.shape.procs}: give both the same sharding")
        self._slice_unknown = False
        self._reshape(procs)
        if self._given is not None:
            self.resume(self._given)
        return True

    # -- the state and its plan ---------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        if self._slice_unknown and self._given is not None:
            return dict(self._given)
        return self._state.to_json()

    def resume(self, state: Mapping[str, Any]) -> bool:
        """Continue from `state` (`get_state()`'s); whether the plan changed with it."""
        if self._slice_unknown:  # applied by use_data_slice
            self._given = state
            return False
        resized = self._sized(state.get("pipeline") or () if isinstance(state, Mapping)
                              else ())
        changed = resized.describe() != self.dataset.describe()
        # the block shuffle's sizes the state was saved with (taken once it resumes)
        sh = shape(resized, self.options.worker.window, self.shape.procs) if changed \
            else self.shape
        new = LoaderState.from_json(state).resume_as(
            sh.fingerprint, sh.unit, sh.process_count, sh.batch_mode,
            process_index=sh.procs[0] if sh.procs else 0)
        if changed:
            self.dataset, self.shape = resized, sh
        if self._meta is None:  # compiled for it once the files are open (`open`)
            self._become(new)
            return False
        old = self.plan
        same = old is not None and not changed and _key(new) == _plan_key(old)
        self._settle(new, old if same and old is not None else self._compile(new))
        return self.plan is not old

    def open(self, meta: SourceMeta) -> Plan:
        """The files are open (`meta`): the plan for the state."""
        self._meta = meta
        self._settle(self._state, self._compile(self._state))
        assert self.plan is not None
        return self.plan

    def batches_from(self, position: int, longest: bool = False) -> int | None:
        """Batches from `position` to the end of the plan (None if endless); `longest`: of
        the longest process shard (the steps every process takes to stay in lockstep)."""
        plan = self.plan
        assert plan is not None
        index = longest_shard(plan, self.dataset) if longest else plan.index
        if index.length is None:
            return None
        if not plan.batch_mode:
            raise ValueError("num_batches() needs batch() without filter, flat_map, pack or "
                             "bucket_by_length")
        return plan.batches_from(position, index.length)

    def _sized(self, saved: Any = ()) -> Dataset:
        """The described dataset with its block shuffle's unset sizes chosen (`saved`: a
        state's pipeline, whose sizes win)."""
        if unsized(self.described) is None:
            return self.described
        read = self.options.read
        return sized(self.described, read.resident_bytes, read.memory_budget,
                     [str(ln) for ln in saved])

    def _compile(self, state: LoaderState) -> Plan:
        assert self._meta is not None
        return compile(self.dataset, self._meta, self.options, unit=state.unit,
                       procs=self.shape.procs, layout=state.layout, state=state)

    def _settle(self, state: LoaderState, plan: Plan) -> None:
        """Take `state` (moved to this process count by `plan`, which made its lanes) and
        `plan`, once the state is checked to lie in its stream."""
        if state.moved:
            state = dataclasses.replace(state, lane=plan_lane(plan))
        state.check_position(plan.length, self.shape.batch_mode, plan.cuts)
        self.plan = plan
        self._become(state)


def plan_lane(plan: Plan | None) -> Any:
    """The plan's lanes as a state holds them (None: the process's own shard)."""
    return None if plan is None or plan.lane is None else lane_json(plan.lane)


def _key(state: LoaderState) -> tuple:
    """What of a state its plan depends on (a moved state's lanes, yet to be made, match no
    plan's)."""
    return (state.unit, tuple(state.layout), state.lane)


def _plan_key(plan: Plan) -> tuple:
    return (plan.unit, tuple(plan.layout), plan_lane(plan))
