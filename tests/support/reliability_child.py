"""Helpers for tests/io/test_reliability_faults.py, and the training process those tests kill.

Imported by the tests (and by loader worker processes, which import the transforms below by
name), and run as a script::

    python tests/support/reliability_child.py train LOG CKPT EVERY SLEEP PATH... [--resume]
                                      [--workers N]
    python tests/support/reliability_child.py exit-without-close PATH... [--raise]

``train`` runs one shuffled epoch over local ArrayRecord files. Every batch's record ids go to
LOG as one JSON line (append, flush, fsync), and every EVERY batches the loader state goes to
CKPT atomically (tmp file, fsync, ``os.replace``) with the number of batches logged so far. With
``--resume`` it reads CKPT, truncates LOG to the checkpointed batch count (a kill may have left
batches after the checkpoint, and half a line), and continues from the saved state.

``exit-without-close`` starts a loader with two worker processes, takes one batch, prints its
pid, its shared-memory files, the memory files it holds and its child processes as one JSON
line, and ends the script without closing the loader: ``sys.exit(0)``, or with ``--raise`` an
uncaught exception.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import zlib
from pathlib import Path

if __name__ == "__main__":  # run as a script: import this file's package the same way tests do
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

import aioloader as al

BATCH = 32
SEED = 11


def make_record(i: int) -> bytes:
    """Record `i`: JSON with its id and a filler whose length varies, so sizes differ."""
    return json.dumps({"id": i, "pad": "r" * (i % 23)}).encode()


def write_shards(root: Path, n: int, shards: int) -> list[str]:
    """`n` records dealt round-robin over `shards` files, group size 1 (a chunk per record)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(shards):
        path = root / f"part-{k:03d}-of-{shards:03d}.array_record"
        with al.ArrayRecordWriter(path, group_size=1) as w:
            for i in range(k, n, shards):
                w.write(make_record(i))
        paths.append(str(path))
    return paths


def decode(record: bytes) -> dict:
    """The record's id, and a checksum of its bytes (so a wrong or torn read shows)."""
    return {"id": np.int64(json.loads(record)["id"]), "crc": np.uint32(zlib.crc32(record))}


def pipeline(paths, *, storage_options=None, batch: int = BATCH, seed: int = SEED):
    return (al.Dataset.from_arrayrecord(paths, storage_options=storage_options)
            .shuffle(seed).map(decode).batch(batch))


def ids_of(batch) -> list[int]:
    return np.asarray(batch["id"]).tolist()


# -- transforms that take their worker process down (used with functools.partial) --------------


def _stamp(path: str) -> None:
    """Record when the crash happens (wall clock), for the test to time the error from."""
    with open(path, "w") as f:
        f.write(repr(time.time()))
        f.flush()
        os.fsync(f.fileno())


def kill_on_id(element: dict, *, victim: int, stamp: str) -> dict:
    """SIGKILL this (worker) process on record `victim`."""
    if int(element["id"]) == victim:
        _stamp(stamp)
        os.kill(os.getpid(), signal.SIGKILL)
    return element


def segfault_on_id(element: dict, *, victim: int, stamp: str) -> dict:
    """Crash this (worker) process with a segmentation fault on record `victim`."""
    if int(element["id"]) == victim:
        _stamp(stamp)
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return element


# -- the training process ------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def train(log: Path, ckpt: Path, every: int, sleep_s: float, paths: list[str],
          resume: bool, workers: int = 0) -> int:
    state, done = None, 0
    if resume:
        saved = json.loads(ckpt.read_text())
        state, done = saved["state"], int(saved["batches"])
        lines = log.read_text().splitlines(keepends=True) if log.exists() else []
        kept = [ln for ln in lines if ln.endswith("\n")][:done]  # drop a torn last line
        if len(kept) != done:
            raise SystemExit(f"log has {len(kept)} complete batches, checkpoint says {done}")
        _write_atomic(log, "".join(kept))
    run = "resumed" if resume else "first"
    loader = pipeline(paths).loader(workers=workers, prefetch=2, state=state)
    with open(log, "a") as f:
        for batch in loader:  # a for loop closes the loader when it ends
            f.write(json.dumps({"run": run, "batch": done, "ids": ids_of(batch)}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            done += 1
            if done % every == 0:
                _write_atomic(ckpt, json.dumps({"state": loader.get_state(), "batches": done}))
            time.sleep(sleep_s)
    print(json.dumps({"batches": done}), flush=True)
    return 0


_KEEP: list = []


def exit_without_close(paths: list[str], fall_over: bool) -> int:
    import psutil

    from tests.support.procs import memory_files, worker_pids

    loader = pipeline(paths, batch=8).loader(workers=2, prefetch=2)
    it = iter(loader)
    _KEEP.extend([loader, it])  # alive until interpreter exit, never closed
    batch = next(it)
    me = psutil.Process()
    # (the first batch may have come from this process while the workers started)
    loader.pool.wait_started(30)
    deadline = time.monotonic() + 30
    while len(worker_pids(me)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    children = [{"pid": p.pid, "ppid": p.ppid(), "cmdline": " ".join(p.cmdline())}
                for p in me.children(recursive=True)]
    shm = sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"aioloader-{me.pid}-"))
    print(json.dumps({"pid": me.pid, "ids": ids_of(batch), "children": children, "shm": shm,
                      "arena": memory_files(me.pid, "aioloader-arena")}),
          flush=True)
    if fall_over:
        raise RuntimeError("falling over with the loader open")
    return 0  # `it` (and its loader) are still open: interpreter exit must clean up


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    flags = {a for a in args if a.startswith("--")}
    args = [a for a in args if not a.startswith("--")]
    if mode == "train":
        workers = 0
        if "--workers" in flags:
            workers = int(args.pop())
        log, ckpt, every, sleep_s, *paths = args
        return train(Path(log), Path(ckpt), int(every), float(sleep_s), paths,
                     "--resume" in flags, workers)
    if mode == "exit-without-close":
        return exit_without_close(args, "--raise" in flags)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    # Run the copy imported by name, so that workers unpickle `tests.support.reliability_child.*`
    # and the pipeline is the very one the tests build.
    from tests.support.reliability_child import main as _main

    sys.exit(_main(sys.argv[1:]))
