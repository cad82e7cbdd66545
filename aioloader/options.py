"""The loader's settings: grouped by the part that uses them, typed, and checked here, once.

`ds.loader(...)` takes each setting as a keyword (`workers=2, io_concurrency=256`) or by group
(`read=ReadOptions(...)`, `worker=WorkerOptions(...)`, or all of them as `options=
LoaderOptions(...)`); either way it builds one frozen `LoaderOptions` that the runtime reads
and never checks again. Each setting is documented once, in its group's docstring.

Counts and byte sizes must be whole numbers; a float with an integral value (`1e9`) is taken
as that integer, since `memory_budget=1e9` is a natural way to write a size.
"""

from __future__ import annotations

import difflib
import os
import random
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from .arguments import whole
from .mounts import in_memory

__all__ = [
    "DEFAULT_WINDOW",
    "LoaderOptions",
    "PrefetchOptions",
    "ReadOptions",
    "RetryPolicy",
    "WorkerOptions",
    "unknown_options_error",
]

AUTO = "auto"  # a setting tuned while the loader runs (`aioloader.runtime.autotune`)
DEFAULT_WINDOW = 256  # output positions per task in filter/pack pipelines
GCS_CLIENTS = ("auto", "curl", "fsspec")
"""The gs:// clients `gcs_client` names (`aioloader.io.gcs.client` makes them)."""
GcsClient = Literal["auto", "curl", "fsspec"]


def _outside_level() -> int:
    """The `stacklevel` that names the caller's first frame outside aioloader (and the
    dataclass machinery), so that a `DeprecationWarning` is shown: by default, only one
    attributed to `__main__` is."""
    level, frame = 1, sys._getframe(2)  # (level 1: the function that warns)
    while frame.f_back is not None and (
            frame.f_globals.get("__name__", "").startswith(("aioloader.", "dataclasses"))
            or frame.f_code.co_filename.startswith("<")):
        frame, level = frame.f_back, level + 1
    return level + 1


def gcs_client_named(client: str, source: str = "gcs_client") -> str:
    """`client` checked against `GCS_CLIENTS` (`source`: where it was given, for the error).
    "aiohttp", whose client was removed, still reads the same data: through "fsspec"."""
    if client == "aiohttp":
        warnings.warn(f"{source}='aiohttp' is deprecated: its reads go through gcsfs's own "
                      "(gcs_client='fsspec'); use 'fsspec', or 'auto' for the fastest client "
                      "the storage_options allow", DeprecationWarning,
                      stacklevel=_outside_level())
        return "fsspec"
    if client not in GCS_CLIENTS:
        raise ValueError(f"{source} must be one of {', '.join(map(repr, GCS_CLIENTS))} or "
                         f"None (AIOLOADER_GCS_CLIENT, else 'auto'), got {client!r}")
    return client


def _whole(obj: Any, name: str, lo: int, *, optional: bool = False,
           auto: bool = False) -> None:
    """Check that field `name` is a whole number >= `lo` (or None, if `optional`; or "auto",
    if `auto`) and store it as an `int`; the error names the option as the user spelled it."""
    value = getattr(obj, name)
    if (value is None and optional) or (value == AUTO and auto):
        return
    if auto and isinstance(value, str):
        raise ValueError(f"{name} must be an integer or {AUTO!r}, got {value!r}")
    object.__setattr__(obj, name, whole(value, name, lo, floats=True,
                                        alt=" or None" if optional else ""))


def _path(obj: Any, name: str, *, none_means: str | None = None) -> None:
    """`obj.name` as a str if it is a path (None stays None); with `none_means`, an empty
    one is refused, saying what None would mean."""
    value = getattr(obj, name)
    if value is None:
        return
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path or None, got {type(value).__name__}")
    object.__setattr__(obj, name, os.fspath(value))
    if none_means is not None and not getattr(obj, name):
        raise ValueError(f"{name} must name a directory, or be None ({none_means}); got ''")


@dataclass(frozen=True)
class RetryPolicy:
    """How reads are retried, when a silent store is given up on, when a slow one is hedged.

    Retry delays grow as base * 2^k with full jitter. The defaults, and why:

    - `timeout` 3 s: an attempt that receives nothing (no response head, no body bytes) for
      3 s ends and is retried. A range GET's head normally comes well within a second; a
      download that keeps receiving bytes is never cut, however long it takes.
    - `deadline` 10 s: a read waits at most this long for answers (no attempt waits past it,
      none starts after it), so a bucket that stops answering is reported within ~10 s, and
      within 13 s (`deadline + timeout`, under 15 s) if it stalls mid-body just before the
      deadline. Error answers (503, 429, resets) end sooner, after `attempts`.
    - hedging: a request with no response head after max(`hedge_multiplier` x the median time
      to a head over the last 64 requests, `hedge_after`) = max(4 x median, 0.5 s) gets one
      duplicate; at most `max_hedges` (4) in flight, and `hedge_budget` (5%) of requests on
      average. `hedge_after=None` turns hedging off.
    """

    attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 2.0
    timeout: float = 3.0  # silence (no head, no body bytes) that ends an attempt
    deadline: float = 10.0  # the longest a read waits for answers, all attempts together
    hedge_after: float | None = 0.5  # the least wait for a head before a hedge; None: never
    hedge_multiplier: float = 4.0  # or this many times the median wait for a head
    hedge_budget: float = 0.05  # hedges per request, on average
    max_hedges: int = 4  # hedges in flight at once

    def __post_init__(self) -> None:
        for name in ("timeout", "deadline", "hedge_multiplier"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RetryPolicy.{name} must be > 0, got {getattr(self, name)}")
        if self.attempts < 1 or self.max_hedges < 0:
            raise ValueError("RetryPolicy.attempts must be >= 1 and max_hedges >= 0")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy.base_delay and max_delay must be >= 0")
        if self.hedge_after is not None and self.hedge_after < 0:
            raise ValueError(f"RetryPolicy.hedge_after must be >= 0 or None, got "
                             f"{self.hedge_after}")
        if not 0 <= self.hedge_budget <= 1:
            raise ValueError(f"RetryPolicy.hedge_budget must be in [0, 1], got "
                             f"{self.hedge_budget}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How bytes are fetched (the source and its `Storage`).

    - `io_concurrency` (64): range reads in flight at once; raise it for high-latency buckets.
      "auto" starts at 64 and doubles while reads are the limit (up to 1024).
    - `memory_budget` (512 MiB): bytes being fetched at once, and the most one chunk may
      decode to (a file claiming more is refused before anything is allocated); half of it
      is the workers' decoded-chunk cache (shared out among them).
    - `retry` (None: `RetryPolicy()`'s defaults): how reads are retried, timed out, hedged.
    - `max_gap` (None: 16 KiB for local files, 256 KiB for remote): neighbouring reads are
      merged across gaps up to this many bytes; 0 merges only touching reads.
    - `resident_bytes` (1 GiB): a remote dataset up to this size is fetched in segments
      after the first batch and kept in memory (per process); 0 reads record by record.
    - `cache_dir` (None): a private local directory where segments (~4 MiB runs of whole
      chunks) of a remote dataset too large for `resident_bytes` are kept across epochs,
      restarts and the processes of one host (`aioloader.cache`): a background download
      fills it while reads go on, each segment downloaded once per host.
    - `cache_bytes` (64 GiB): the most the entries in `cache_dir` may take (least recently
      used out first; the disk also keeps 5%, at least 1 GiB, free whatever this says).
    - `index_cache_dir` ("auto"): a private local directory where the files' footer index
      is kept (`aioloader.cache.index_cache`): a later open lists the files, then maps one
      table, instead of reading and parsing every file's tail (on a bucket, a request per
      file). It must belong to this user and be writable by no one else (else
      `PermissionError`). "auto": gs:// datasets' indices are kept in the user's cache
      directory (`~/.cache/aioloader/index`, or `$XDG_CACHE_HOME/aioloader/index`, or the
      directory `$AIOLOADER_INDEX_CACHE` names; `off` there: none), at most 1 GiB of
      entries, the least recently used out first (a generation proves each object's content
      there); local files and other stores are not cached. None or False: no index
      cache (False also as a flat `loader()` setting, where None means "not given").
    - `spill_dir` (None: the system's temporary directory, or /var/tmp where that is held
      in memory; else a `ValueError` if it is not an existing directory, and a warning if
      it is held in memory: RAM outside `memory_budget`): a local directory for the spill
      of an exact shuffle over large chunks (`aioloader.workers.spill`): when an epoch
      needs more than one horizon, each chunk's decoded records are written there once, by
      the first horizon that decodes it, and later horizons and epochs of the loader read
      them back instead of decoding the chunk again. The file has no name (nothing is left
      behind, even by a killed process) and goes when the loader closes.
    - `spill_bytes` (None: the decoded bytes of the files' chunks, if they fit a quarter of
      the directory's free space and leave a tenth of the disk free; else no spill): the
      most the spill may take (never the disk's last tenth); it is taken on the disk when
      the spill opens; chunks past it are decoded per horizon. 0: no spill.
    - `gcs_client` (None: the AIOLOADER_GCS_CLIENT environment variable, else "auto"): what
      serves gs:// range reads: "curl" (libcurl, about half the CPU per request; needs
      pycurl, in the `gcs` extra), "fsspec" (gcsfs's own reads), or "auto" (curl when pycurl
      is installed and the storage_options are ones it serves, else fsspec). Listing and
      credentials use gcsfs either way. "aiohttp" (deprecated) means "fsspec".
    """

    io_concurrency: int | Literal["auto"] = 64
    memory_budget: int = 512 << 20
    retry: RetryPolicy | None = None
    max_gap: int | None = None
    resident_bytes: int = 1 << 30
    cache_dir: str | None = None
    cache_bytes: int = 64 << 30
    index_cache_dir: str | Literal[False] | None = "auto"
    spill_dir: str | None = None
    spill_bytes: int | None = None
    gcs_client: GcsClient | None = None

    def __post_init__(self) -> None:
        _whole(self, "io_concurrency", 1, auto=True)
        _whole(self, "memory_budget", 1)
        _whole(self, "max_gap", 0, optional=True)
        _whole(self, "resident_bytes", 0)
        _whole(self, "cache_bytes", 0)
        _whole(self, "spill_bytes", 0, optional=True)
        _path(self, "cache_dir")
        if self.index_cache_dir is False:  # (False: none, where a flat None means "not given")
            object.__setattr__(self, "index_cache_dir", None)
        _path(self, "index_cache_dir", none_means="no index cache")
        _path(self, "spill_dir", none_means="the temporary directory")
        if self.spill_dir is not None:
            if not os.path.isdir(self.spill_dir):
                what = "is not a directory" if os.path.exists(self.spill_dir) else \
                    "does not exist"
                raise ValueError(f"spill_dir {self.spill_dir!r} {what}: name an existing "
                                 "directory of local disk, or None (the temporary "
                                 "directory)")
            if in_memory(self.spill_dir):
                warnings.warn(f"spill_dir {self.spill_dir!r} is held in memory (tmpfs): the "
                              "spill there takes RAM outside memory_budget; name a "
                              "directory of local disk", stacklevel=_outside_level())
        if self.gcs_client is not None:
            object.__setattr__(self, "gcs_client", gcs_client_named(self.gcs_client))
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be an aioloader.RetryPolicy or None, got "
                            f"{type(self.retry).__name__}")


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How records are decoded and transformed (the decode pool).

    - `workers` (0): workers (processes, or threads with `executor="threads"`); 0 runs the
      same code on one thread of this process.
      "auto" starts with one and adds one while the consumer waits on decoding and a core
      is free (up to the cores this process may use; `aioloader.runtime.autotune`).
    - `slot_size` (32 MiB): bytes of one shared-memory slot to start with, which holds a
      task's output (and its remote input), and how large small batches grouped into one
      task may grow. Slots grow to hold a larger batch (sized from the files' records
      before the first task, or after a task found its slot too small), so batches of any
      size come back through shared memory; only the pages used are memory.
    - `window` (None: 256): output positions per task in filter/pack pipelines, where a
      task's output size is not known in advance; ignored with a plain `batch()`, whose
      tasks are whole batches. A resumed state keeps the window it was saved with.
    - `executor` ("processes"): where the `workers` run their tasks: "processes" (a pool of
      worker processes), "threads" (threads of this process), "ray" (Ray actors; the `ray`
      extra), or an executor kind object (`aioloader.workers.kinds.ExecutorKind`). The
      batches, the state and resuming are the same whichever runs them; with workers=0
      tasks run on one thread of this process whatever is named.
    - `first_in_parent` (False): True runs the first tasks one at a time on a thread of this
      process while the worker processes start (a fresh worker server takes a fraction of a
      second to a few seconds), with the workers' code, so the first batch does not wait for
      them; the batches and the state are the same. Off by default: with it, a transform
      that can crash its process (a segfault in a native decoder) could take down this
      process instead of a worker (a `WorkerError`). Processes only: threads start at once,
      Ray actors never run tasks here.
    """

    workers: int | Literal["auto"] = 0
    slot_size: int = 32 << 20
    window: int | None = None
    executor: Any = "processes"
    first_in_parent: bool = False

    def __post_init__(self) -> None:
        _whole(self, "workers", 0, auto=True)
        _whole(self, "slot_size", 1)
        _whole(self, "window", 1, optional=True)
        if not isinstance(self.first_in_parent, bool):
            raise TypeError(f"first_in_parent must be True or False, got "
                            f"{self.first_in_parent!r}")
        if isinstance(self.executor, str):
            if self.executor not in EXECUTORS:
                raise ValueError(f"executor must be one of {', '.join(map(repr, EXECUTORS))} "
                                 f"or an executor kind object, got {self.executor!r}")
        elif not callable(getattr(self.executor, "open", None)):
            raise TypeError(f"executor must be one of {', '.join(map(repr, EXECUTORS))} or "
                            f"an object with an open(...) method (an executor kind), got "
                            f"{type(self.executor).__name__}")


EXECUTORS = ("processes", "threads", "ray")  # executor names (`aioloader.workers.kinds`)


@dataclass(frozen=True, kw_only=True)
class PrefetchOptions:
    """How far ahead the loader works.

    - `prefetch` (None: `default_prefetch(workers)`, 2 × workers, at least 4 and at most
      32): tasks (batches, or windows) in flight and kept ready ahead of the consumer,
      delivered in order whatever finishes first. "auto" starts at 4 and grows by one while
      the consumer waits (up to 16). Not given, with workers="auto", it is tuned the same
      way from its default up (a deeper queue when the machine is shared), never below it.

    Any "auto" setting is tuned while the loader runs (`aioloader.runtime.autotune`), and never
    changes what it yields; `stats().as_dict()["autotune"]` shows the values chosen.
    """

    prefetch: int | Literal["auto"] | None = None

    def __post_init__(self) -> None:
        _whole(self, "prefetch", 1, optional=True, auto=True)

    def resolved(self, workers: int | str, cores: int) -> int | str:
        """The prefetch given ("auto" included), or the default for `workers` (for "auto"
        workers, the `cores` it may grow to)."""
        if self.prefetch is not None:
            return self.prefetch
        return default_prefetch(cores if workers == AUTO else int(workers))


def default_prefetch(workers: int) -> int:
    """Tasks in flight by default: two per worker, so each has the next task in hand while
    the results wait in order behind the slowest one (a task that finishes late holds the
    window, and the others keep working); at least 4 (what one thread needs to overlap
    reads with decoding) and at most 32 (each task in flight holds one batch)."""
    return min(32, max(4, 2 * workers))


_GROUPS: dict[str, type] = {"read": ReadOptions, "worker": WorkerOptions,
                            "prefetch": PrefetchOptions}


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """All of a loader's settings: `read` (`ReadOptions`), `worker` (`WorkerOptions`) and
    `prefetch` (`PrefetchOptions`); each defaults to its group's defaults.

    `trace` (None): record a Chrome/Perfetto trace of every stage and worker
    (`aioloader.runtime.trace`): True keeps it for `it.stats().trace(path)`; a path also
    writes it there when the loader closes; None leaves it to the AIOLOADER_TRACE
    environment variable (a path); False: off whatever that says.
    """

    read: ReadOptions = field(default_factory=ReadOptions)
    worker: WorkerOptions = field(default_factory=WorkerOptions)
    prefetch: PrefetchOptions = field(default_factory=PrefetchOptions)
    trace: bool | str | os.PathLike[str] | None = None  # a path is kept as a str

    def __post_init__(self) -> None:
        if self.trace is not None and not isinstance(self.trace, bool):
            if not isinstance(self.trace, (str, os.PathLike)):
                raise TypeError(f"trace must be True, False, a path or None, got "
                                f"{type(self.trace).__name__}")
            object.__setattr__(self, "trace", os.fspath(self.trace))
        for name, cls in _GROUPS.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                hint = " (the number of processes is workers=)" if name == "worker" else ""
                raise TypeError(f"LoaderOptions.{name} must be a {cls.__name__}, got "
                                f"{value!r}{hint}")

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """Every setting's name, group by group (`workers`, `io_concurrency`, ...)."""
        return tuple(f.name for cls in _GROUPS.values() for f in fields(cls))

    def merged(self, *, read: ReadOptions | None = None, worker: WorkerOptions | None = None,
               trace: bool | str | os.PathLike[str] | None = None,
               **settings: Any) -> LoaderOptions:
        """A copy with the groups given replaced, then the settings given (not None) replaced
        in their groups: the most specific wins. The result is checked again."""
        stray = set(settings) - set(self.field_names())
        if stray:
            raise unknown_options_error(stray, self.field_names(), "LoaderOptions.merged()")
        base = LoaderOptions(read=self.read if read is None else read,
                             worker=self.worker if worker is None else worker,
                             prefetch=self.prefetch)  # checks the groups' types
        groups = {name: getattr(base, name) for name in _GROUPS}
        for name, cls in _GROUPS.items():
            changes = {f.name: settings[f.name] for f in fields(cls)
                       if settings.get(f.name) is not None}
            if changes:
                groups[name] = replace(groups[name], **changes)
        return LoaderOptions(**groups, trace=self.trace if trace is None else trace)


def unknown_options_error(unknown: Iterable[str], valid: Iterable[str], where: str) -> TypeError:
    """The error for keywords `where` does not take, with the closest valid name for each
    (`num_workers` -> `workers`), and the list of valid ones."""
    valid = list(valid)
    parts = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return TypeError(f"{where} got unknown option{'s' if len(parts) > 1 else ''} "
                     f"{', '.join(parts)}; valid: {', '.join(valid)}")

