"""The decoded-record spill (`workers.spill`): a region written by a fill job reads back as
the chunk's records, for any records and any wanted subset; what does not check is never
copied out; a refused write says so and spills no more; the file has no name, so nothing is
left behind, not even by a killed process; and the default is on only where the disk has room.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import resource
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.arrayrecord.index import read_index
from aioloader.index.planning import ChunkRefs
from aioloader.workers import extract as extract_mod
from aioloader.workers import spill as spill_mod
from aioloader.workers.decode import Decoder
from aioloader.workers.extract import StashFile, read_entry, slices
from aioloader.workers.messages import SPILL_BAD, SPILL_REFUSED, Fill, Spill
from aioloader.workers.spill import SpillFile, SpillWriter, open_spill, read_into, region_bytes


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB file system held in memory (a full disk in a test); skipped where it cannot
    be mounted (not root)."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                      capture_output=True).returncode:
        pytest.skip("a tmpfs cannot be mounted here")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def _free(where) -> int:
    s = os.statvfs(where)
    return s.f_bavail * s.f_frsize


@pytest.fixture
def spill(tmp_path):
    f = SpillFile(str(tmp_path), 64 << 20)
    yield f
    f.close()


def _records(draw_sizes: list[int], seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(n) for n in draw_sizes]


def _bounds(records: list[bytes]) -> np.ndarray:
    b = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in records], out=b[1:])
    return b


def _write(spill: SpillFile, key, records: list[bytes], pieces: int = 1) -> Spill:
    """Chunk `key`'s records written as a fill job would, in `pieces` steps."""
    data = b"".join(records)
    job = spill.job(key, len(records), len(data))
    assert job is not None and job.write
    w = SpillWriter(job)
    w.begin(_bounds(records), len(data))
    cuts = np.linspace(0, len(data), pieces + 1).astype(int)
    for a, b in itertools.pairwise(cuts):
        w.piece(data[a:b])
    spill.outcome(key, job, w.end())
    again = spill.job(key, len(records), len(data))
    assert again is not None and not again.write
    return again


def _copy_out(data, bounds, wanted):
    got, offs, blob = slices(data, bounds, wanted, None)
    return [bytes(blob[a:b]) for a, b in itertools.pairwise(offs[: len(got) + 1])]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=80),
       pieces=st.integers(1, 7), seed=st.integers(0, 1000), data=st.data())
def test_a_written_region_reads_back_any_wanted_records(tmp_path_factory, sizes, pieces,
                                                        seed, data):
    records = _records(sizes, seed)
    wanted = np.array(sorted(set(data.draw(st.lists(st.integers(0, len(records) - 1))))),
                      dtype=np.int64)
    f = SpillFile(str(tmp_path_factory.getbasetemp()), 64 << 20)
    try:
        _write(f, ("a", 0), [b"x" * 5000] * 3)  # (a region before it: offsets not 0)
        job = _write(f, ("f", 7), records, pieces)
        assert job.offset % spill_mod.ALIGN == 0
        assert read_into(job, wanted, _copy_out) == [records[int(w)] for w in wanted]
    finally:
        f.close()


def test_a_region_that_does_not_check_is_never_copied_out(spill):
    records = [b"abc", b"", b"defgh"]
    job = _write(spill, ("f", 0), records)
    fd = os.open(spill.path, os.O_RDWR)
    try:
        head = job.offset + spill_mod.HEAD
        for at, bad in ((job.offset, 4), (head, -1), (head + 8, 9), (head + 24, 2)):
            old = os.pread(fd, 8, at)
            os.pwrite(fd, np.int64(bad).tobytes(), at)  # a count, a first/middle/last offset
            assert read_into(job, np.array([0, 2]), _copy_out) is None
            os.pwrite(fd, old, at)
        assert read_into(job, np.array([0, 2]), _copy_out) == [b"abc", b"defgh"]
    finally:
        os.close(fd)
    # a region of other size than written, or a record the chunk has not
    assert read_into(dataclasses.replace(job, size=job.size + 8), np.array([0]),
                     _copy_out) is None
    assert read_into(job, np.array([3]), _copy_out) is None


def test_a_job_never_opens_another_file_by_the_spills_number(spill, tmp_path):
    """Once the loader closed the spill its number may be another file's: a job whose path
    opens a file of another identity neither reads nor writes it."""
    job = _write(spill, ("f", 0), [b"abc"])
    other = tmp_path / "data"
    other.write_bytes(b"keep")
    with open(other, "rb") as h:
        fake = dataclasses.replace(job, path=f"/proc/{os.getpid()}/fd/{h.fileno()}")
        assert read_into(fake, np.array([0]), _copy_out) is None
        w = SpillWriter(dataclasses.replace(fake, write=True, size=1 << 16))
        w.begin(np.array([0, 3]), 3)
        w.piece(b"xyz")
        assert w.end() == 0
    assert other.read_bytes() == b"keep"


def test_only_regions_whose_job_reported_them_written_are_read(spill):
    key = ("f", 0)
    job = spill.job(key, 2, 10)
    assert job is not None and job.write
    spill.outcome(key, job, 0)  # (the job failed, or its chunk was not what the index said)
    assert spill.job(key, 2, 10) == job  # written again by the next fill, never read
    w = SpillWriter(job)
    w.begin(np.array([0, 4, 5000]), 5000)  # more bytes than its region holds: not spilled
    w.piece(b"x" * 5000)
    assert w.end() == 0
    w = SpillWriter(job)
    w.begin(np.array([0, 4, 10]), 10)
    w.piece(b"x" * 10)
    w.piece(b"y")  # the stream decodes past its size: nothing past the region
    assert w.end() == 0
    assert spill.figures() == {"spill_bytes": 0, "spill_hits": 0}


def test_the_spill_stops_at_its_bytes(tmp_path):
    room = int(region_bytes(3, 100))
    f = SpillFile(str(tmp_path), 2 * room)
    try:
        assert f.job(1, 3, 100) is not None and f.job(2, 3, 100) is not None
        assert f.job(3, 3, 100) is None  # no room: decoded per horizon
        assert f.reserved == 2 * room
    finally:
        f.close()


def test_a_write_the_disk_refuses_is_said_and_no_more_are_tried(spill):
    """A file-size limit refuses the write as a full disk would (an error, not a signal)."""
    key = ("f", 0)
    job = spill.job(key, 2, 1 << 20)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, old_limit[1]))
    try:
        w = SpillWriter(job)  # type: ignore[arg-type]
        w.begin(np.array([0, 1 << 19, 1 << 20]), 1 << 20)
        w.piece(b"x" * (1 << 20))
        got = w.end()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert got == SPILL_REFUSED
    spill.outcome(key, job, got)  # type: ignore[arg-type]
    assert spill.refused and spill.job(("g", 0), 2, 10) is None and spill.job(key, 2, 10) is None


def test_the_spill_file_has_no_name_and_goes_with_its_process(tmp_path):
    f = SpillFile(str(tmp_path), 1 << 20)
    _write(f, ("f", 0), [b"abc"])
    assert os.listdir(tmp_path) == [] and os.path.exists(f.path)
    f.close()
    assert not os.path.exists(f.path)
    code = textwrap.dedent(f"""
        import os, sys
        from aioloader.workers.spill import SpillFile
        f = SpillFile({str(tmp_path)!r}, 1 << 20)
        with open(f.path, "r+b") as h:
            h.write(b"x" * 100000)
        print(len(os.listdir({str(tmp_path)!r})), flush=True)
        os.kill(os.getpid(), 9)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                         timeout=60)
    assert run.returncode == -9, run.stderr
    assert run.stdout.strip() == "0" and os.listdir(tmp_path) == []


def test_the_default_spill_is_all_or_nothing_within_the_disks_room(tmp_path):
    s = os.statvfs(tmp_path)
    free, disk = s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize
    room = spill_mod.room(str(tmp_path))
    assert room <= free // 4 and free - room >= disk // 10
    f, said = open_spill(str(tmp_path), None, room + 1)
    assert f is None and "off" in said and str(tmp_path) in said
    f, said = open_spill(str(tmp_path), 0, 10)
    assert f is None and "spill_bytes=0" in said
    f, said = open_spill(str(tmp_path), None, 1 << 20)
    assert f is not None and said.startswith("on") and f.max_bytes == 1 << 20
    f.close()
    f, said = open_spill(str(tmp_path), 1 << 19, 1 << 20)  # set: a part of it
    assert f is not None and f.max_bytes == 1 << 19 and "of the 1 MB" in said
    f.close()
    f, said = open_spill(str(tmp_path / "missing"), None, 10)
    assert f is None and "cannot hold it" in said


def test_a_directory_held_in_memory_is_not_the_default(tmpfs, monkeypatch):
    """The system's temporary directory on a tmpfs: /var/tmp instead (or none, if that is
    held in memory too)."""
    monkeypatch.setattr(spill_mod.tempfile, "gettempdir", lambda: str(tmpfs))
    where = spill_mod.default_dir()
    assert where == (None if spill_mod.in_memory("/var/tmp") else "/var/tmp")


def _chunk_file(tmp_path, options: str) -> tuple[str, list[bytes], ChunkRefs]:
    rng = np.random.default_rng(3)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 4000, 300)]
    path = str(tmp_path / f"{options.replace(':', '_').replace(',', '_')}.array_record")
    with al.ArrayRecordWriter(path, options=options) as w:
        for r in records:
            w.write(r)
    with open(path, "rb") as h:
        data = h.read()
    ix = read_index(len(data), lambda o, k: data[o : o + k], path=path)
    n = ix.chunk_records[0]
    refs = ChunkRefs([path], np.zeros(1, np.int64), np.zeros(1, np.int64),
                     ix.chunk_offsets[:1], ix.chunk_ends[:1], np.zeros(1, np.int64),
                     count=np.array([n]))
    return path, records[:n], refs


@pytest.mark.parametrize("options, piece", [("group_size:300,zstd:3", 1024),
                                            ("group_size:300,zstd:3", 1 << 22),
                                            ("group_size:300,brotli:3", 1024),
                                            ("group_size:300,uncompressed", 1024)])
def test_a_fill_job_spills_its_chunk_and_the_next_fill_reads_it_back(tmp_path, options,
                                                                     piece, monkeypatch):
    """A write job lays out what a plain fill does and spills every record; a read job
    lays out the same entry without reading the data file."""
    monkeypatch.setattr(extract_mod, "PIECE", piece)
    _, records, refs = _chunk_file(tmp_path, options)
    stash, dec = StashFile(1 << 22), Decoder(0)
    f = SpillFile(str(tmp_path), 64 << 20)
    wanted = np.arange(0, len(records), 7, dtype=np.int64)
    try:
        def fill(offset: int, spill: Spill | None) -> list[bytes]:
            job = Fill(stash.path, offset, 1 << 20, wanted, spill)
            assert dec.fill(refs, None, job) == len(wanted)
            _, offs, data = read_entry(dec.view(stash.path)[offset : offset + (1 << 20)])
            return [bytes(data[a:b]) for a, b in itertools.pairwise(offs)]

        want = [records[int(w)] for w in wanted]
        decoded = sum(len(r) for r in records)
        job = f.job(("k", 0), len(records), decoded)
        assert fill(0, job) == want and dec.decoded == 1
        f.outcome(("k", 0), job, dec.spilled)  # type: ignore[arg-type]
        assert dec.spilled == spill_mod.HEAD + 8 * (len(records) + 1) + decoded
        job = f.job(("k", 0), len(records), decoded)
        assert job is not None and not job.write
        reads, dec.decoded = dec.files.reads, 0
        assert fill(1 << 20, job) == want and dec.decoded == 0 and dec.hits == 1
        assert dec.files.reads == reads  # (the data file is not read)
        assert dec.spilled == 0
        with open(f.path, "r+b", buffering=0) as h:  # a record's offset made wrong
            h.seek(job.offset + spill_mod.HEAD + 8)
            h.write(np.int64(-5).tobytes())
        assert dec.fill(refs, None, Fill(stash.path, 0, 1 << 20, wanted, job)) == 0
        assert dec.spilled == SPILL_BAD and dec.hits == 0
    finally:
        dec.close()
        stash.close()
        f.close()


def test_a_fill_whose_spill_the_disk_refuses_still_lays_out_its_records(tmp_path):
    """The write fails past a file-size limit (as on a full disk): the stash entry is whole,
    the job says the spill was refused, and nothing of it is ever read."""
    _, records, refs = _chunk_file(tmp_path, "group_size:300,zstd:3")
    stash, dec = StashFile(1 << 22), Decoder(0)
    f = SpillFile(str(tmp_path), 64 << 20)
    wanted = np.arange(0, len(records), 5, dtype=np.int64)
    try:
        dec.view(stash.path)  # (made and mapped before the limit)
        decoded = sum(len(r) for r in records)
        assert decoded > 1 << 18
        job = f.job(("k", 0), len(records), decoded)
        old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, old_limit[1]))
        try:
            n = dec.fill(refs, None, Fill(stash.path, 0, 1 << 20, wanted, job))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
            signal.signal(signal.SIGXFSZ, old_handler)
        assert n == len(wanted) and dec.spilled == SPILL_REFUSED
        _, offs, data = read_entry(dec.view(stash.path)[: 1 << 20])
        assert [bytes(data[a:b]) for a, b in itertools.pairwise(offs)] == \
            [records[int(w)] for w in wanted]
        f.outcome(("k", 0), job, dec.spilled)  # type: ignore[arg-type]
        assert f.refused and f.job(("k", 0), len(records), decoded) is None
    finally:
        dec.close()
        stash.close()
        f.close()


def test_the_spill_takes_its_bytes_as_it_opens_so_the_next_loader_sees_them_gone(tmpfs):
    """Two default spills on one disk (two ranks of a host): the first takes its bytes at
    once, the second, asked the same, finds no room (before, each saw the same free space
    and the two together could fill the disk)."""
    free = _free(tmpfs)
    need = spill_mod.room(str(tmpfs)) - spill_mod.ALIGN
    first, said = open_spill(str(tmpfs), None, need)
    try:
        assert first is not None and said.startswith("on")
        assert free - _free(tmpfs) >= need  # (taken, not yet written)
        second, said = open_spill(str(tmpfs), None, need)
        assert second is None and "off" in said
        assert _free(tmpfs) >= free // 2  # the default leaves most of the disk free
    finally:
        if first is not None:
            first.close()
    assert _free(tmpfs) == free  # (let go)


def test_a_spill_the_disk_cannot_hold_is_off_and_takes_nothing(tmpfs):
    free = _free(tmpfs)
    with pytest.raises(OSError):
        SpillFile(str(tmpfs), 8 << 20)  # (more than the disk)
    assert _free(tmpfs) == free and os.listdir(tmpfs) == []


def test_a_refused_write_gives_the_unwritten_tail_back(tmp_path):
    """After a refused write the file keeps only its written regions: the rest of what it
    took is the disk's again, and no region is reserved any more."""
    f = SpillFile(str(tmp_path), 32 << 20)
    try:
        assert os.stat(f.path).st_blocks * 512 >= 32 << 20
        done = _write(f, ("f", 0), [b"abc" * 100])
        key = ("f", 1)
        job = f.job(key, 2, 1 << 20)
        assert job is not None
        f.outcome(key, job, SPILL_REFUSED)
        st = os.stat(f.path)
        assert st.st_size == done.offset + int(region_bytes(1, 300))
        assert st.st_blocks * 512 < 1 << 20
        assert read_into(done, np.array([0]), _copy_out) == [b"abc" * 100]  # (kept)
        assert f.job(("f", 2), 1, 10) is None and f.figures()["spill_refused"] == 1
    finally:
        f.close()


def test_a_job_never_uses_a_file_with_a_name_or_without_the_spills_nonce(spill, tmp_path):
    """What a job's path opens must have no name and the spill's nonce at its start, even
    where its (device, inode) is the spill's (a file made after the spill closed may take
    both its number and its inode)."""
    job = _write(spill, ("f", 0), [b"abc"])
    wrong = dataclasses.replace(job, nonce=os.urandom(spill_mod.NONCE))
    assert read_into(wrong, np.array([0]), _copy_out) is None
    w = SpillWriter(dataclasses.replace(wrong, write=True, size=1 << 16))
    w.begin(np.array([0, 3]), 3)
    w.piece(b"xyz")
    assert w.end() == 0
    assert read_into(job, np.array([0]), _copy_out) == [b"abc"]  # (untouched)
    named = tmp_path / "named"
    named.write_bytes(spill.nonce + bytes(1 << 16))
    with open(named, "r+b") as h:
        st = os.fstat(h.fileno())
        fake = dataclasses.replace(job, path=f"/proc/{os.getpid()}/fd/{h.fileno()}",
                                   ident=(st.st_dev, st.st_ino))
        assert read_into(fake, np.array([0]), _copy_out) is None
        w = SpillWriter(dataclasses.replace(fake, write=True, size=1 << 16))
        w.begin(np.array([0, 3]), 3)
        w.piece(b"xyz")
        assert w.end() == 0
    assert named.read_bytes() == spill.nonce + bytes(1 << 16)


def test_a_write_that_ends_after_a_refusal_is_not_kept(spill):
    """A job in flight when another's write was refused: its region was given back, so
    what it wrote is never read, and the file is cut again."""
    late = spill.job(("f", 1), 1, 3)
    refused = spill.job(("f", 2), 2, 1 << 20)
    assert late is not None and refused is not None
    spill.outcome(("f", 2), refused, SPILL_REFUSED)
    w = SpillWriter(late)
    w.whole(np.array([0, 3]), b"abc")
    spill.outcome(("f", 1), late, w.end())
    assert spill.job(("f", 1), 1, 3) is None and spill.figures()["spill_bytes"] == 0
    assert os.stat(spill.path).st_size == spill_mod.ALIGN
