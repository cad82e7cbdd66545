"""A process with a real, low descriptor limit, for tests/io/test_descriptors.py::

    python tests/support/descriptors_child.py OUT LIMIT read ROOT WORKERS
    python tests/support/descriptors_child.py OUT LIMIT exhaust PATH
    python tests/support/descriptors_child.py OUT LIMIT exhaust-loader ROOT FREE

The soft `RLIMIT_NOFILE` is set to LIMIT before aioloader is imported (so its forkserver and
workers inherit it). ``read`` reads every record of ROOT/*.array_record through a shuffled
loader with WORKERS workers, then through random access: the records read each way, sorted,
and the most descriptors this process held. ``exhaust`` takes every free descriptor, then
reads PATH through the process's data-file descriptors: the error it got.
``exhaust-loader`` leaves FREE descriptors free, then reads ROOT/*.array_record with two
workers: the error it got. The answer goes to the file OUT as JSON (not to stdout: a large
write to a pipe that worker processes share was seen cut short).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _open_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def read(root: str, workers: int) -> dict:
    import aioloader as al

    pattern = os.path.join(root, "*.array_record")
    ds = al.Dataset.from_arrayrecord(pattern).shuffle(seed=3).batch(16)
    most = 0
    got = []
    for batch in ds.loader(workers=workers):
        got.extend(r.decode() for r in batch)
        most = max(most, _open_count())
    with al.ArrayRecordSource(pattern) as src:
        direct = [r.decode() for r in src[list(range(len(src)))[::-1]]]
        most = max(most, _open_count())
    return {"loader": sorted(got), "direct": sorted(direct), "most_open": most}


def _take_all(free: int = 0) -> list[int]:
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for fd in held[:free]:
        os.close(fd)
    return held[free:]


def _error_when_exhausted(free: int, run) -> dict:
    """`run()` with every descriptor but `free` taken: the OSError it raises, if any."""
    held = _take_all(free)
    try:
        run()
    except OSError as err:
        return {"error": str(err)}
    finally:
        for fd in held:
            os.close(fd)
    return {"error": None}


def exhaust(path: str) -> dict:
    from aioloader.io.descriptors import FileSet

    return _error_when_exhausted(0, lambda: FileSet().pread(path, 8, 0))


def exhaust_loader(root: str, free: int) -> dict:
    import aioloader as al

    ds = al.Dataset.from_arrayrecord(os.path.join(root, "*.array_record")).batch(4)
    return _error_when_exhausted(free, lambda: list(ds.loader(workers=2)))


def main() -> None:
    dest, limit, mode, *args = sys.argv[1:]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(limit), hard))
    out = (read(args[0], int(args[1])) if mode == "read" else exhaust(args[0])
           if mode == "exhaust" else exhaust_loader(args[0], int(args[1])))
    Path(dest).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
