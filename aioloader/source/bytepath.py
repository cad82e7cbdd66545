"""The byte path: what a task carries to the workers for its records' chunk refs.

One chain decides, once, which tier serves a task's records: the memory tier (its segments,
pinned until the task is done), the disk tier (segment files on this host), the store (the
bucket, read here; a local file is a store the worker preads itself). Each link serves the
refs or passes them on to the link below it (the disk tier may pass on only the records it
does not hold); the store always serves. The task code asks the chain once (`BytePath.serve`)
and carries the answer (`Carry`) to the workers; the link that serves also says how large
tasks may grow (`Link.goal`): records the workers read themselves go several batches a task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..index.planning import ChunkRefs

if TYPE_CHECKING:
    from ..cache.tier import DiskTier
    from ..describe.plan import Plan

Hint = Callable[[], None]  # tells the memory tier what comes next (the runtime's readahead)


@dataclasses.dataclass(frozen=True)
class Carry:
    """A link's answer: where the workers read each record's chunk (`refs`: the files, or a
    tier's places), the chunks' bytes when read here (`raws`, one per record), what to call
    once the task is done (`release`: a tier's pins), and the link that served."""

    refs: ChunkRefs
    link: Link
    raws: list[Any] | None = None
    release: Callable[[], None] | None = None

    def done(self) -> None:
        """The workers are done with the task's records."""
        if self.release is not None:
            self.release()


class Link:
    """One tier of the chain: `serve` the refs, or pass them on to `below`."""

    below: Link | None = None
    own_files = False  # the workers read the dataset's own files (their reads are its I/O)

    async def serve(self, refs: ChunkRefs) -> Carry:
        raise NotImplementedError

    def goal(self, plan: Plan, nbytes: int) -> int:
        """Batches per task while this link serves, for batches of `nbytes`."""
        return plan.task_size_goal(nbytes)


class LocalStore(Link):
    """Local files: the worker preads each record's chunk itself."""

    own_files = True

    async def serve(self, refs: ChunkRefs) -> Carry:
        return Carry(refs, self)


class Bucket(Link):
    """A remote store: the chunks read here, through the source's fetch stage (merged range
    reads, the raw chunk cache)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    async def serve(self, refs: ChunkRefs) -> Carry:
        return Carry(refs, self, raws=await self.source.fetch_refs(refs))


class MemoryTier(Link):
    """The memory tier of a remote dataset (`source.resident`): serves the records whose
    segments it keeps (the workers read them there), pinned until the task is done. It takes
    the readahead hints (`advise`), unless the disk tier below already holds everything."""

    def __init__(self, source: Any, below: Link, disk: DiskTier | None) -> None:
        self.source, self.below, self.disk = source, below, disk

    def advise(self, hint: Hint) -> None:
        if not (self.disk is not None and self.disk.complete()):
            hint()

    async def serve(self, refs: ChunkRefs) -> Carry:
        lease = await self.source.resident_refs(refs)
        if lease is None:
            return await self.below.serve(refs)  # type: ignore[union-attr]
        return Carry(lease.refs, self, release=lease.release)

    def goal(self, plan: Plan, nbytes: int) -> int:
        """As for local files, within the stored bytes a task may pin in a bounded tier
        (`SegmentStore.task_bytes`); one batch from a tier that keeps the dataset whole."""
        source = self.source
        store = source.resident
        if store is None or store.whole or not len(source):
            return 1
        stored = sum(f.size for f in source.table.files) / len(source)
        fits = int(store.task_bytes // max(1.0, stored * plan.unit))
        grouped = dataclasses.replace(plan, groups_batches=True)
        return max(1, min(fits, grouped.task_size_goal(nbytes)))


class DiskStore(Link):
    """The disk tier of a remote dataset: a task whose records all lie in segments on disk
    is sent to those files (the workers read them); otherwise every record's bytes are read
    here, those on disk from their files, the rest passed on to the store below."""

    def __init__(self, tier: DiskTier, below: Link) -> None:
        self.tier, self.below = tier, below

    async def serve(self, refs: ChunkRefs) -> Carry:
        on_disk = await self.tier.local_refs(refs)
        if on_disk is not None:
            return Carry(on_disk, self)
        return Carry(refs, self, raws=await self.tier.fetch_refs(refs, self._rest))

    async def _rest(self, refs: ChunkRefs) -> list[Any]:
        return (await self.below.serve(refs)).raws  # type: ignore[union-attr,return-value]

    def goal(self, plan: Plan, nbytes: int) -> int:
        """Every segment on disk: the workers read them all, as local files."""
        return plan.task_size_goal(nbytes, grouped=True)


class Stashed(Link):
    """A horizon's stash (`runtime.horizons`) holds every record of the task: nothing is
    carried, and tasks grow as for local files (the workers copy the records out there)."""

    async def serve(self, refs: ChunkRefs) -> Carry:
        return Carry(refs, self)

    def goal(self, plan: Plan, nbytes: int) -> int:
        return plan.task_size_goal(nbytes, grouped=True)


class BytePath:
    """The chain over one opened source (and its disk tier, if any), highest link first."""

    def __init__(self, source: Any, disk: DiskTier | None = None) -> None:
        self.disk: DiskStore | None = None
        self.memory: MemoryTier | None = None
        self.store: Link
        self.top: Link
        if source.all_local:
            self.top = self.store = LocalStore()
        else:
            below: Link = Bucket(source)
            self.store = below
            if disk is not None:
                below = self.disk = DiskStore(disk, self.store)
            self.top = self.memory = MemoryTier(source, below, disk)
        self.stashed = Stashed()  # (outside the chain: the runtime says when it serves)
        self.last: Link | None = None  # the link that served the last request

    @property
    def links(self) -> list[Link]:
        """The chain's links, highest first (not the stash: it is outside the chain)."""
        out: list[Link] = []
        link: Link | None = self.top
        while link is not None:
            out.append(link)
            link = link.below
        return out

    def advise(self, hint: Hint) -> None:
        """`hint`: the readahead of a task's positions, for the memory tier (called before
        the task's fetch, which it does not wait for)."""
        if self.memory is not None:
            self.memory.advise(hint)

    async def serve(self, refs: ChunkRefs, stashed: bool = False) -> Carry:
        """What a task carries for `refs` (`stashed`: its horizon's stash holds them all)."""
        carry = await (self.stashed if stashed else self.top).serve(refs)
        self.last = carry.link
        return carry

    def serving(self) -> Link:
        """The link whose reads set the task size now: the stash while it holds the tasks'
        records, the disk tier once every segment is on disk, the memory tier while it
        serves the tasks, else the store."""
        if self.last is self.stashed:
            return self.stashed
        if self.disk is not None and self.disk.tier.complete():
            return self.disk
        if self.memory is not None and self.last is self.memory:
            return self.memory
        return self.store
