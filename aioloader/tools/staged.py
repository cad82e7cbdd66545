"""Output files that appear whole or not at all: `convert`'s shards, staged beside their names.

Each shard is written under a hidden temporary name beside its output,
`.NAME.<16 hex>.tmp`, and renamed into place only when every shard succeeded (`Staged`): a
failed or interrupted conversion leaves existing files as they were.

A run killed outright (`kill -9`, a lost machine) cannot remove its temporaries, so the next
conversion to the same prefix does (`sweep_leftovers`) and says so. A local temporary is
locked (`flock`) by the process writing it for as long as it lives, and the kernel drops the
lock when the process dies: a temporary that can be locked is an orphan, one that cannot
belongs to a conversion still running and is left alone. Remote temporaries cannot be
locked; on object stores they exist only between the writers' close and the final moves, so
those found are removed (a run still moving them then fails loudly, never silently).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import stat
from collections.abc import Sequence
from typing import IO, Any

import fsspec

from ..urls import is_local, redact

__all__ = ["Staged", "sweep_leftovers"]

log = logging.getLogger("aioloader")

_SHARD_TAIL = r"-\d{5}-of-\d{5}\.array_record"


class Staged:
    """Output files written under hidden temporary names beside them, placed only at the end.

    Local temporaries are created exclusively (O_EXCL|O_NOFOLLOW, a random name) and locked
    while this process lives, so nothing planted there is written through; `place` renames
    each over its output, which replaces a symlink rather than following it. Without
    `overwrite`, existing output (a dangling symlink included) is refused before anything is
    written, and a name that appears meanwhile is not replaced either (placed by hard link,
    which fails on an existing name). fsspec URLs are written to temporary objects and moved
    at the end (on gs:// a server-side copy).
    """

    def __init__(self, paths: Sequence[str], overwrite: bool,
                 storage_options: dict | None = None) -> None:
        self.paths = list(paths)
        self.overwrite = overwrite
        self.local = is_local(self.paths[0])
        self.fs = None if self.local else \
            fsspec.core.url_to_fs(self.paths[0], **(storage_options or {}))[0]
        self.temps = [_temp_name(self._at(p)) for p in self.paths]
        self.files: list[IO[bytes]] = []
        if not overwrite:
            self._refuse([p for p in self.paths if self._exists(p)])

    def open(self) -> list[IO[bytes] | str]:
        """Writer targets: exclusively created, locked files (local), or temporary URLs."""
        if not self.local:
            return list(self.temps)
        for k, path in enumerate(self.paths):
            fd, self.temps[k] = _create_locked(self.temps[k], _local([path])[0])
            self.files.append(os.fdopen(fd, "wb"))
        return list(self.files)

    def finish(self, k: int) -> None:
        """Shard `k` is complete: make it durable (local; it stays open, and locked)."""
        if self.local:
            self.files[k].flush()
            os.fsync(self.files[k].fileno())

    def place(self) -> None:
        """Move every temporary over its output."""
        if not self.local:
            for tmp, path in zip(self.temps, self.paths):
                self.fs.mv(tmp, path)  # type: ignore[union-attr]
            return
        placed = []
        try:
            for tmp, path in zip(self.temps, _local(self.paths)):
                if self.overwrite:
                    os.replace(tmp, path)
                else:
                    _place_new(tmp, path)
                placed.append(path)
        except FileExistsError:
            for path in placed:  # ours, just made: nothing else is there
                os.unlink(path)
            self._refuse([p for p in self.paths if self._exists(p)])
            raise
        _fsync_dir(os.path.dirname(_local(self.paths)[0]) or ".")

    def discard(self) -> None:
        """Remove the temporaries (after a failure; after `place`, what is left of them),
        never an output. A temporary that cannot be removed is logged, never raised: the
        error that brought us here is the one to report."""
        for f in self.files:
            with contextlib.suppress(OSError):
                f.close()  # drops the lock
        for tmp in self.temps:
            try:
                if self.local:
                    os.unlink(tmp)
                elif self.fs.exists(tmp):  # type: ignore[union-attr]
                    self.fs.rm(tmp)  # type: ignore[union-attr]
            except FileNotFoundError:
                pass
            except Exception as exc:  # cleanup must not hide the real error
                log.warning("could not remove the temporary %s: %s", redact(tmp),
                            redact(str(exc)) or type(exc).__name__)

    def _at(self, path: str) -> str:
        return _local([path])[0] if self.local else path

    def _exists(self, path: str) -> bool:
        if self.local:
            return os.path.lexists(_local([path])[0])
        return self.fs.exists(path)  # type: ignore[union-attr]

    @staticmethod
    def _refuse(existing: list[str]) -> None:
        if not existing:
            return
        shown = ", ".join(redact(p) for p in existing[:10])
        more = f" and {len(existing) - 10} more" if len(existing) > 10 else ""
        raise FileExistsError(f"output already exists: {shown}{more}; pass --overwrite "
                              f"(overwrite=True) to replace {'them' if existing[1:] else 'it'}")


def _temp_name(path: str) -> str:
    head, _, name = path.rpartition("/")
    return f"{head}{'/' if head else ''}.{name}.{secrets.token_hex(8)}.tmp"


def _create_locked(tmp: str, path: str) -> tuple[int, str]:
    """A new temporary for `path`, created exclusively and locked: (fd, name). A sweeper
    that removed the name between our create and our lock is noticed, and a new name made."""
    while True:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(tmp, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    return fd, tmp
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        tmp = _temp_name(path)


def sweep_leftovers(prefix: str, storage_options: dict | None = None) -> list[str]:
    """Remove the temporaries that conversions to `prefix` (any shard count) left when they
    were killed; returns their names, redacted. A warning says what was removed, and that
    another conversion to `prefix` is running if one holds temporaries there."""
    head, _, name = _local([prefix])[0].rpartition("/") if is_local(prefix) else \
        prefix.rpartition("/")
    pattern = re.compile(rf"\.{re.escape(name)}{_SHARD_TAIL}\.[0-9a-f]{{16}}\.tmp")
    removed, busy = _sweep_local(head, pattern) if is_local(prefix) else \
        _sweep_remote(head, pattern, storage_options or {})
    if removed:
        shown = ", ".join(removed[:10]) + (f" and {len(removed) - 10} more"
                                           if len(removed) > 10 else "")
        log.warning("removed %d temporary file%s left by an interrupted conversion to %s: %s",
                    len(removed), "s" if removed[1:] else "", redact(prefix), shown)
    if busy:
        log.warning("another conversion to %s is running (it holds %d temporary files there)",
                    redact(prefix), busy)
    return removed


def _sweep_local(head: str, pattern: re.Pattern) -> tuple[list[str], int]:
    directory = head or "."
    try:
        names = sorted(n for n in os.listdir(directory) if pattern.fullmatch(n))
    except FileNotFoundError:
        return [], 0
    removed, busy = [], 0
    for name in names:
        path = os.path.join(head, name) if head else name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone meanwhile, or not a file we made (a symlink): not ours
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its writer is alive
                busy += 1
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(redact(path))
        finally:
            os.close(fd)
    return removed, busy


def _sweep_remote(head: str, pattern: re.Pattern,
                  storage_options: dict) -> tuple[list[str], int]:
    protocol = head.split("://", 1)[0]
    try:
        fs, path = fsspec.core.url_to_fs(head, **storage_options)
        found: Any = fs.glob(f"{path.rstrip('/')}/.*.tmp")
    except Exception as exc:  # not listable (http://...): writing says why
        log.debug("could not list %s for leftovers: %s", redact(head), redact(str(exc)))
        return [], 0
    removed = []
    for name in sorted(found):
        if pattern.fullmatch(name.rpartition("/")[2]):
            with contextlib.suppress(FileNotFoundError):
                fs.rm(name)
                removed.append(redact(f"{protocol}://{name}"))
    return removed, 0


def _place_new(tmp: str, path: str) -> None:
    """Rename `tmp` to `path`, which must not exist: a hard link fails if it does."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError:  # no hard links on this file system: check, then rename
        if os.path.lexists(path):
            raise FileExistsError(path) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _local(paths: Sequence[str]) -> list[str]:
    return [p.removeprefix("file://") for p in paths]


def _fsync_dir(path: str) -> None:
    """Make the renames durable (best effort: not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
