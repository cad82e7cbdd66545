"""Local data files read through a capped set of descriptors (`aioloader.io.descriptors`): far
more shards than the process may hold descriptors read whole and correctly, by the parent
and by workers, under a real `RLIMIT_NOFILE` (set in a child process)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.errors import ObjectChangedError
from aioloader.io.descriptors import Descriptors, FileSet, cap_for, spans

CHILD = Path(__file__).parents[1] / "support" / "descriptors_child.py"


def _shards(root: Path, shards: int, per: int = 2, group_size: int = 1) -> list[str]:
    """`shards` files of `per` records each; record `s-j` is record j of shard s."""
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with al.ArrayRecordWriter(root / f"s{s:05d}.array_record",
                                  group_size=group_size) as w:
            for j in range(per):
                w.write(f"{s}-{j}".encode())
    return sorted(f"{s}-{j}" for s in range(shards) for j in range(per))


def _child(tmp_path: Path, *args: str, timeout: float = 120) -> dict:
    out = tmp_path / "child.json"
    run = subprocess.run([sys.executable, str(CHILD), str(out), *args], capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(("workers", "group_size"), [(0, 1), (2, 1), (2, 3)])
def test_many_more_shards_than_descriptors_read_whole(tmp_path, workers, group_size):
    """200 shards under a limit of 64 descriptors (the parent's open, the workers' reads,
    random access), every record read once and correctly, the limit never reached."""
    want = _shards(tmp_path / "ds", 200, per=2 if group_size == 1 else 7,
                   group_size=group_size)
    out = _child(tmp_path, "64", "read", str(tmp_path / "ds"), str(workers))
    assert out["loader"] == want
    assert out["direct"] == want
    assert out["most_open"] < 64


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_ten_thousand_shards_under_the_usual_limit(tmp_path_factory, workers):
    root = tmp_path_factory.getbasetemp() / "ten-thousand"
    if not (root / "done").exists():
        _shards(root, 10_000, per=1)
        (root / "done").touch()
    want = sorted(f"{s}-0" for s in range(10_000))
    out = _child(root, "1024", "read", str(root), str(workers), timeout=600)
    assert out["loader"] == want
    assert out["direct"] == want


def test_out_of_descriptors_names_the_limit_and_what_to_do(tmp_path):
    path = tmp_path / "a"
    path.write_bytes(b"x" * 64)
    out = _child(tmp_path, "48", "exhaust", str(path))
    assert out["error"] is not None
    assert "48 descriptors" in out["error"] and "ulimit -n" in out["error"], out


def test_a_loader_out_of_descriptors_names_the_limit(tmp_path):
    """Out of descriptors while the loader starts (its memory files, its workers' pipes):
    the error says the limit and what to do, not a bare EMFILE from a thread."""
    _shards(tmp_path / "ds", 4)
    out = _child(tmp_path, "64", "exhaust-loader", str(tmp_path / "ds"), "12")
    assert out["error"] is not None
    assert "64 descriptors" in out["error"] and "ulimit -n" in out["error"], out


def test_the_cap_leaves_room_for_sockets_and_pipes():
    assert cap_for(1024) == 896
    assert cap_for(64) == 32
    assert 8 <= cap_for(16) < 16


def _files(tmp_path: Path, n: int) -> list[str]:
    out = []
    for k in range(n):
        p = tmp_path / f"f{k}"
        p.write_bytes(bytes([k]) * 100)
        out.append(str(p))
    return out


def test_descriptors_stay_under_the_cap_and_reads_are_right(tmp_path):
    paths = _files(tmp_path, 20)
    fds = Descriptors(cap=4)
    files = FileSet(fds)
    for _ in range(3):
        for k, p in enumerate(paths):
            assert files.pread(p, 10, 5) == bytes([k]) * 10
            assert len(fds) <= 4
    files.close()
    assert len(fds) == 0


def test_a_held_descriptor_is_never_closed_under_a_read(tmp_path):
    """Holding more files than the cap opens the rest beyond it; none is closed while held,
    and what is kept is back under the cap once they are let go."""
    paths = _files(tmp_path, 10)
    fds = Descriptors(cap=3)
    files = FileSet(fds)
    held = files.hold(paths)
    other = FileSet(fds)
    for p in paths[::-1]:  # another reader's traffic meanwhile evicts what it may
        other.pread(p, 1, 0)
    assert [os.pread(fd, 1, 0) for fd in held] == [bytes([k]) for k in range(10)]
    files.let_go(paths, held)
    assert len(fds) <= 3
    other.close()
    files.close()
    assert len(fds) == 0


def test_threads_share_the_descriptors(tmp_path):
    paths = _files(tmp_path, 30)
    fds = Descriptors(cap=5)
    errors = []

    def reader(seed: int) -> None:
        files = FileSet(fds)
        try:
            for i in range(600):
                k = (i * 7 + seed) % len(paths)
                assert files.pread(paths[k], 3, 50) == bytes([k]) * 3
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(fds) <= 5


def test_a_file_replaced_mid_run_is_an_error_not_mixed_data(tmp_path):
    """A path reopened after its descriptor was evicted, naming another file now, fails
    loudly instead of reading the new file's bytes at the old file's offsets."""
    paths = _files(tmp_path, 6)
    fds = Descriptors(cap=2)
    files = FileSet(fds)
    assert files.pread(paths[0], 1, 0) == b"\0"
    for p in paths[1:]:  # evicts paths[0]
        files.pread(p, 1, 0)
    new = tmp_path / "new"
    new.write_bytes(b"\xff" * 100)
    os.replace(new, paths[0])
    with pytest.raises(ObjectChangedError, match="replaced by another file"):
        files.pread(paths[0], 1, 0)
    os.unlink(paths[1])
    with pytest.raises(ObjectChangedError, match="deleted"):
        files.pread(paths[1], 1, 0)


def test_a_new_reader_of_a_rebuilt_file_reads_the_new_file(tmp_path):
    """A descriptor kept from an earlier reader (the file since replaced) is not lent to a
    new reader: it reads what the path names now."""
    (path,) = _files(tmp_path, 1)
    fds = Descriptors(cap=4)
    first = FileSet(fds)
    assert first.pread(path, 1, 0) == b"\0"
    new = tmp_path / "new"
    new.write_bytes(b"\x07" * 100)
    os.replace(new, path)
    assert FileSet(fds).pread(path, 1, 0) == b"\x07"
    assert len(fds) == 1


@given(st.lists(st.integers(0, 30), max_size=200), st.integers(1, 12))
def test_spans_cover_every_read_in_order_with_few_files_each(files, limit):
    cut = spans(files, len(set(files)), limit)
    assert cut[0][0] == 0 and cut[-1][1] == len(files)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cut))
    assert all(len(set(files[lo:hi])) <= limit for lo, hi in cut)
    assert len(cut) == 1 or all(hi > lo for lo, hi in cut)
    # greedy: each span but the last stops only where one more file would pass the limit
    assert all(len(set(files[lo : hi + 1])) > limit for lo, hi in cut[:-1])
