"""Memory that our worker processes can open by path, and that cannot outlive its users.

On Linux it is an anonymous memory file (`memfd_create`): not a name in /dev/shm, so nothing
is left behind whatever kills us (SIGKILL of the whole process group included); the kernel
frees it when the last descriptor and map of it go. Other processes of the same user open
it as `/proc/<pid>/fd/<n>` while this process lives (`worker_path`). Elsewhere there is no
such path: either memory for this process only (an anonymous map), or, where workers must
share it, a named file in /dev/shm (or the temp directory), private and unlinked on close
(and by workers that see us die): the best that can be done without memfd.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import tempfile


def shareable() -> bool:
    """Whether workers can open our memory files by path (Linux: memfd and /proc)."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


class MemoryFile:
    """`size` bytes of shared memory, mapped here (`map`; None when empty).

    `worker_path` opens it in another process of ours (None: not shareable, and `named` was
    not asked for). `named_path` is set only for the named fallback: the file to unlink if
    this process dies (workers do it; see `aioloader.workers.worker`).
    """

    def __init__(self, name: str, size: int, *, named: bool = False) -> None:
        self.fd: int | None = None
        self.worker_path: str | None = None
        self.named_path: str | None = None
        self.map: mmap.mmap | None = None
        self._pid = os.getpid()
        try:
            if shareable():
                self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
                os.fchmod(self.fd, 0o600)  # (only our user can reach /proc/<pid>/fd anyway)
                self.worker_path = f"/proc/{os.getpid()}/fd/{self.fd}"
            elif named:
                root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
                path = os.path.join(root, f"{name}-{os.getpid()}-{secrets.token_hex(6)}")
                self.fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                self.worker_path = self.named_path = path
            if self.fd is not None:
                os.ftruncate(self.fd, size)
            if size:
                self.map = mmap.mmap(-1 if self.fd is None else self.fd, size)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unmap (unless views of it are still held: it goes with the last of them), close
        the descriptor, and remove the name of the fallback file (not from a forked child:
        the name is its parent's). Idempotent."""
        mem, self.map = self.map, None
        if mem is not None:
            with contextlib.suppress(BufferError):
                mem.close()
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
        path, self.named_path = self.named_path, None
        if path is not None and self._pid == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
