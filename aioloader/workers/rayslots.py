"""The Ray executor's shared-memory slots: how a batch made by an actor on this host comes
back without Ray's object store.

The executor keeps an arena (`aioloader.workers.arena`) as the process pool does. Each task
takes a free slot here before it is queued; when it goes to an actor on this host, the task
names the slot's memory file (`Task.arena`), the actor maps it (`RAY_ACTOR_SLOTS`), stacks
the batch right in the slot as a worker process does, and sends back only the result's
small descriptor. The batch is then lent to the consumer as views of the slot, writable, and
the slot comes back when the last of them is dropped. An actor on another node (or one told
to get its bytes from here, `read_here`) is not given the slot: its batch comes by value.

A slot is written by one actor at a time. The parent hands each task its own slot, and
keeps it while a call that may still write it is out: a task whose caller gave up while its
call runs has its slot back only once that call has ended. A task whose actor died while
running it runs again on a fresh slot: the old one is kept out of use until the executor
closes (the dead actor's process may not be gone yet, and nothing it wrote is read).
A batch larger than its slot asks for room: the arena grows and the task runs again.
"""

from __future__ import annotations

from typing import Any

from .arena import Arena, Blob, Pickled
from .messages import Result, Task

__all__ = ["RaySlots", "map_slot"]


class RaySlots:
    """The slots of one Ray executor's tasks (each task's: `Task.slot`)."""

    def __init__(self, slots: int, slot_size: int) -> None:
        self.arena = Arena(slots, slot_size)
        self.dropped = 0  # slots an actor died writing: kept out of use until close

    def take(self, task: Task) -> None:
        """A free slot for `task` (-1: none free, and its batch comes by value)."""
        task.slot, task.arena = self.arena.take(), None

    def route(self, task: Task, here: bool) -> None:
        """`task` is going to an actor: on this host (`here`) it names its slot."""
        task.arena = self.arena.where(task.slot) if here and task.slot >= 0 else None

    def moved(self, task: Task) -> None:
        """`task`'s actor died while running it: a fresh slot for its next run."""
        if task.slot >= 0:
            self.dropped += 1
        self.take(task)

    def after(self, ref: Any, task: Task) -> None:
        """`task`'s caller gave up while the call `ref` (a Ray object ref) may still write
        its slot: the slot comes back when the call ends."""
        slot, task.slot = task.slot, -1
        if slot >= 0:
            arena = self.arena
            ref.future().add_done_callback(lambda _: arena.give(slot))

    def give(self, task: Task) -> None:
        """`task`'s slot back (none if it was lent, or handed to `after`)."""
        slot, task.slot = task.slot, -1
        self.arena.give(slot)

    def grow(self, needed: int) -> None:
        self.arena.grow(needed)

    def receive(self, task: Task, result: Result) -> Result:
        """`result`'s payload as it is to be handed on: unpickled (an actor on this host
        pickles what is not an array, as a worker process does) and, when its batch is in
        the task's slot, lent from it (the slot is then the batch's)."""
        if isinstance(result.payload, (Pickled, Blob)):
            result.payload = self.arena.unpickle(result.payload, task.slot)
        if result.slot >= 0 and result.payload is not None:
            result.payload = self.arena.lend(result.payload, result.slot)
            task.slot = -1
        return result

    def figures(self) -> dict[str, int]:
        return {"grown": self.arena.grown, "slots_dropped": self.dropped,
                "slot_bytes": self.arena.slot_size if self.arena.map is not None else 0}

    def close(self) -> None:
        self.arena.close()


def map_slot(task: Task, map_file: Any) -> None:
    """In an actor: map the file of `task`'s slot (`map_file`: the worker's `_map`); if it
    cannot be opened here (another host after all, or /proc closed to this process), the
    task runs without it and its batch comes by value."""
    if task.arena is None:
        return
    path, size, named, _ = task.arena
    try:
        map_file((path, size, named))
    except OSError:
        task.arena, task.slot = None, -1
