"""The "threads" executor (`executor="threads"`): tasks run on `workers` daemon threads of this
process, with the code a worker process runs (`run_task`), taking them in order from one
queue (`inline.InlineExecutor`).

Nothing is pickled: the transforms run as they are (a closure, a lock, a model loaded in this
process), and a batch needs no trip through a pipe. What one decoding process keeps is kept
per thread here, as it is per worker process there: its `Decoder` (local file descriptors,
the reusable read buffers, its share of the decoded-chunk cache, `cache_bytes`), so a thread
never waits on another's cache and the cache holds what the processes' caches together
would. What the processes share is shared here too: the stash of large chunks' records, and
the arena, whose slots the batches are stacked in and lent from as a worker's are (pages
reused from batch to batch, none faulted in afresh; a batch that outgrows its slot goes by
value, and the slots grow for the next ones).

The threads start at once (there is no interpreter to start, so `first_in_parent` means
nothing here) and share this process's GIL: a transform that holds it (pure Python, `json`)
runs on one core whatever the count; one that releases it (NumPy, decoders in C) runs on
as many as there are threads. A thread cannot be killed, so `close` waits a grace period
for the tasks running and then leaves a thread stuck in a transform behind, naming its task
(a daemon thread: it does not keep the process from exiting).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from .decode import Decoder
from .executor import SlotExecutor
from .inline import InlineExecutor, warn_stuck
from .messages import Pipeline, Result, Task
from .worker import _raise_malloc_thresholds, run_task

__all__ = ["THREADS", "Threads", "ThreadsKind"]



class ThreadsKind:
    """The "threads" executor kind (`aioloader.workers.kinds`): `Threads`."""

    name = "threads"

    def open(self, pipeline: Pipeline, workers: int, *, slots: int, slot_size: int,
             lanes: int | None, first_in_parent: bool) -> Threads:
        return Threads(pipeline, workers, slots=slots, slot_size=slot_size, lanes=lanes)


class Threads(SlotExecutor):
    """Runs tasks on `workers` threads of this process, each with its own `Decoder`."""

    def __init__(self, pipeline: Pipeline, workers: int, *, slots: int,
                 slot_size: int = 32 << 20, lanes: int | None = None) -> None:
        if workers < 1:
            raise ValueError("the threads executor has at least one thread (0: `Inline`)")
        super().__init__(pipeline, workers, slots=slots, slot_size=slot_size, lanes=lanes)
        self._threads = InlineExecutor("aioloader-thread", threads=workers)
        self._local = threading.local()
        self._decoders: list[Decoder] = []  # each thread's, made on its first task
        self._decoders_lock = threading.Lock()
        _raise_malloc_thresholds()

    def warm_up(self) -> None:
        self._threads.start()

    def reserve(self, nbytes: int) -> None:
        """Make slots hold `nbytes` before the first task (see `Pool.reserve`)."""
        self.arena.grow(nbytes)

    def _decoder_here(self) -> Decoder:
        """This thread's decoder (made on its first task)."""
        decoder: Decoder | None = getattr(self._local, "decoder", None)
        if decoder is None:
            decoder = self._local.decoder = Decoder(self.cache_bytes)
            with self._decoders_lock:
                self._decoders.append(decoder)
        return decoder

    def _run_here(self, task: Task, where: tuple[Any, int, int] | None) -> Result:
        return run_task(task, self.pipeline, self._decoder_here(), where, False)

    def _submit(self, task: Task, slot: int, describe: str, route: Any
                ) -> tuple[Future, bool]:
        where = self.arena.map_of(slot) if slot >= 0 else None
        # (False: counted as a worker's result, in a slot or by value; `in_parent` is for
        # the tasks a pool runs in this process instead of its workers)
        return self._threads.submit(self._run_here, task, where, label=describe), False

    def _stop(self, grace: float) -> None:
        stuck = self._threads.close(grace)
        # (a thread left stuck in a transform may use its decoder again if the transform
        # ever returns: a closed decoder reopens what it reads, and its result is dropped)
        with self._decoders_lock:
            decoders, self._decoders = self._decoders, []
        for decoder in decoders:
            decoder.close()
        if stuck is not None:
            warn_stuck("a thread of the threads executor", stuck, grace, self.pipeline)


THREADS = ThreadsKind()
