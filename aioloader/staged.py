"""Output files that appear whole or not at all: `convert`'s shards, staged beside their names.

Each shard is written under a hidden temporary name beside its output,
`.NAME.<16 hex>.tmp`, and renamed into place only when every shard succeeded (`Staged`): a
failed or interrupted conversion leaves existing files as they were.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Sequence
from typing import IO

import fsspec

from .urls import is_local, redact

__all__ = ["Staged"]


class Staged:
    """Output files written under hidden temporary names beside them, placed only at the end.

    Local temporaries are created exclusively (O_EXCL|O_NOFOLLOW, a random name), so nothing
    planted there is written through; `place` renames each over its output, which replaces a
    symlink rather than following it. Without `overwrite`, existing output (a dangling symlink
    included) is refused before anything is written, and a name that appears meanwhile is
    not replaced either (placed by hard link, which fails on an existing name). fsspec
    URLs are written to temporary objects and moved at the end (on gs:// a server-side copy).
    """

    def __init__(self, paths: Sequence[str], overwrite: bool) -> None:
        self.paths = list(paths)
        self.overwrite = overwrite
        self.local = is_local(self.paths[0])
        self.fs = None if self.local else fsspec.core.url_to_fs(self.paths[0])[0]
        self.temps = [self._temp_name(p) for p in self.paths]
        self.files: list[IO[bytes]] = []
        if not overwrite:
            self._refuse([p for p in self.paths if self._exists(p)])

    def open(self) -> list[IO[bytes] | str]:
        """Writer targets: exclusively created files (local), or temporary URLs."""
        if not self.local:
            return list(self.temps)
        for tmp in self.temps:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o666)
            self.files.append(os.fdopen(fd, "wb"))
        return list(self.files)

    def finish(self, k: int) -> None:
        """Shard `k` is complete: make it durable (local)."""
        if self.local:
            self.files[k].flush()
            os.fsync(self.files[k].fileno())
            self.files[k].close()

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
        """Remove the temporaries (after a failure), never an output."""
        for f in self.files:
            with contextlib.suppress(OSError):
                f.close()
        for tmp in self.temps:
            with contextlib.suppress(OSError):
                if self.local:
                    os.unlink(tmp)
                else:
                    self.fs.rm(tmp)  # type: ignore[union-attr]

    def _exists(self, path: str) -> bool:
        if self.local:
            return os.path.lexists(_local([path])[0])
        return self.fs.exists(path)  # type: ignore[union-attr]

    def _temp_name(self, path: str) -> str:
        head, _, name = (_local([path])[0] if self.local else path).rpartition("/")
        return f"{head}{'/' if head else ''}.{name}.{secrets.token_hex(8)}.tmp"

    @staticmethod
    def _refuse(existing: list[str]) -> None:
        if not existing:
            return
        shown = ", ".join(redact(p) for p in existing[:10])
        more = f" and {len(existing) - 10} more" if len(existing) > 10 else ""
        raise FileExistsError(f"output already exists: {shown}{more}; pass --overwrite "
                              f"(overwrite=True) to replace {'them' if existing[1:] else 'it'}")


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
