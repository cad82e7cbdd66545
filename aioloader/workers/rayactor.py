"""What runs inside a Ray actor of the "ray" executor (`ray.RayActors` makes it a Ray actor
class): the pipeline loaded once, a decoder, and each task of a call run as a worker process
runs it (`run_task`). Kept apart from the driver's side, which never runs it itself."""

from __future__ import annotations

import os
import pickle

from ..errors import WorkerError
from .decode import Decoder
from .messages import Pipeline, Result, Task
from .raycalls import Raised
from .raycluster import import_ray
from .rayslots import map_slot
from .worker import _load_pipeline, _map, _raise_malloc_thresholds, run_task

__all__ = ["RayActor"]


class RayActor:
    """What runs in an actor (made a Ray actor class by `ray.RayActors`): the pipeline, loaded
    once, and its decoder; `run` runs each task of a call as a worker process would
    (`run_task`: into its slot, `here`, on the parent's host), and returns each one's
    result, or what it raised (`Raised`)."""

    def __init__(self, parts: tuple, cache_bytes: int) -> None:
        _raise_malloc_thresholds()
        self.decoder = Decoder(cache_bytes)
        self.pipeline: Pipeline | None = None
        self.error: str | None = None
        try:
            self.pipeline = _load_pipeline(parts)
        except WorkerError as exc:
            self.error = str(exc).replace("worker process", "Ray actor")
        except Exception as exc:
            self.error = f"a Ray actor could not start ({type(exc).__name__}: {exc})"

    def ready(self) -> tuple[int, str]:
        """The actor's process and node."""
        return os.getpid(), import_ray().get_runtime_context().get_node_id()

    def run(self, tasks: list[Task] | None, here: bool, *parts: bytes
            ) -> list[Result | Raised]:
        """Each task's result (`tasks`, or with None the tasks pickled in `parts`:
        `raycalls.call_args`)."""
        if self.pipeline is None:
            raise WorkerError(self.error)
        if tasks is None:
            tasks = pickle.loads(b"".join(parts))
        out: list[Result | Raised] = []
        for task in tasks:
            try:  # `sendable`: what is not an array must pickle, with a worker's error
                if here:
                    map_slot(task, _map)
                out.append(run_task(task, self.pipeline, self.decoder, None, True,
                                    worker=here))
            except Exception as exc:
                out.append(Raised(_sendable(exc)))
        return out


def _sendable(exc: Exception) -> Exception:
    """`exc`, or one that says what it was where it cannot travel back."""
    try:
        pickle.dumps(exc)
    except Exception:
        return WorkerError(f"{type(exc).__name__}: {exc}")
    return exc
