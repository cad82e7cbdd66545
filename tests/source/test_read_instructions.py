"""Read instructions, `path[start:end]`: array_record's and Grain's way to name records
start..end-1 of one file (TFDS's file instructions use it too), read as array_record's own
`ArrayRecordDataSource` reads them: the same records, in the same order, local and gs://.
"""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest

import aioloader as al
from aioloader.source import ArrayRecordSource
from aioloader.testing import local_gcs

from ..support.arrayrecord_util import make_records, write_theirs


def _oracle(paths: list[str]) -> list[bytes]:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    with ArrayRecordDataSource(paths) as theirs:
        return [theirs[i] for i in range(len(theirs))]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Three files: group size 1, group size 3 (ranges cut chunks), and group size 1 again."""
    root = tmp_path_factory.mktemp("instr")
    out = []
    for k, (count, options) in enumerate([(10, "group_size:1"), (11, "group_size:3"),
                                          (7, "group_size:1")]):
        path = root / f"part-{k}.ar"
        write_theirs(path, make_records(40, count, seed=k), options)
        out.append(str(path))
    return out


def _cases(files: list[str]) -> list[list[str]]:
    p0, p1, p2 = files
    fixed = [[p0 + "[0:3]", p1 + "[2:4]"],  # the example
             [p1 + "[1:10]", p0, p1 + "[4:5]", p2 + "[6:7]"],  # mixed with whole files
             [p2 + "[3:3]", p0 + "[9:10]", p0 + "[0:10]"],  # an empty range, a file twice
             [p1 + "[0:11]"]]
    rng = random.Random(7)
    counts = {p0: 10, p1: 11, p2: 7}
    for _ in range(6):
        case = []
        for p in rng.choices(files, k=rng.randint(1, 5)):
            a = rng.randint(0, counts[p])
            case.append(f"{p}[{a}:{rng.randint(a, counts[p])}]")
        fixed.append(case)
    return fixed


def test_source_reads_what_array_record_reads(files):
    for paths in _cases(files):
        want = _oracle(paths)
        with ArrayRecordSource(paths) as src:
            assert len(src) == len(want), paths
            assert src[:] == want, paths
            if want:  # random access, out of order and repeated
                keys = np.random.default_rng(0).integers(0, len(want), 20).tolist()
                assert src[keys] == [want[k] for k in keys]
                assert src[-1] == want[-1]


def test_dataset_reads_what_array_record_reads(files):
    paths = _cases(files)[1]
    want = _oracle(paths)
    ds = al.Dataset.from_arrayrecord(paths)
    assert list(ds) == want
    assert len(ds) == len(want) and ds[len(want) - 1] == want[-1]
    # a shuffle (exact and block) is a permutation of exactly those records
    for shuffled in (ds.shuffle(3), ds.shuffle(3, strategy="block", block_bytes=64,
                                               window_bytes=256)):
        got = list(shuffled)
        assert sorted(got) == sorted(want) and got != want
    with ds.shuffle(5).loader(workers=2) as it:  # worker processes read the files' chunks
        assert sorted(it) == sorted(want)
    # from_source of such a source: the same records
    with ArrayRecordSource(paths) as src:
        assert list(al.Dataset.from_source(src)) == want
    # a mix counts each input's records by its instructions
    mixed = al.Dataset.mix([al.Dataset.from_arrayrecord([files[0] + "[2:4]"]),
                            al.Dataset.from_arrayrecord([files[1] + "[5:7]"])])
    assert sorted(mixed) == sorted(_oracle([files[0] + "[2:4]", files[1] + "[5:7]"]))
    del ds  # its random access (len, ds[i]) closes here, not on the I/O thread's gc
    gc.collect()


def test_index_cache_keeps_the_ranges(files, tmp_path):
    for k in (0, 2):  # the second names a file twice
        paths = _cases(files)[k]
        want = _oracle(paths)
        for _ in range(2):  # the first open stores the index, the second maps it
            with ArrayRecordSource(paths, index_cache_dir=tmp_path / f"ix{k}") as src:
                assert src[:] == want


def test_a_file_of_the_literal_name_wins(files, tmp_path):
    """A file literally named `x[0:2]` is read whole (never as a glob of `x0`, `x:`, `x2`)."""
    plain = tmp_path / "x.ar"
    write_theirs(plain, make_records(40, 5, seed=1), "group_size:1")
    literal = tmp_path / "x.ar[0:2]"
    records = make_records(30, 4, seed=2)
    write_theirs(literal, records, "group_size:1")
    with ArrayRecordSource(str(literal)) as src:
        assert src[:] == records
    with ArrayRecordSource(str(tmp_path / "x.ar[1:3]")) as src:  # no such file: records 1, 2
        assert src[:] == _oracle([str(tmp_path / "x.ar[1:3]")])


def test_bad_instructions_are_refused(files):
    p0 = files[0]
    with pytest.raises(ValueError, match=r"part-0\.ar\[4:11\].*holds 10"):
        ArrayRecordSource(p0 + "[4:11]")[0]
    with pytest.raises(ValueError, match=r"\[5:3\] ends before it starts"):
        ArrayRecordSource(p0 + "[5:3]")[0]
    with pytest.raises(ValueError, match="not of a glob"):
        ArrayRecordSource(p0.replace("part-0", "part-*") + "[0:1]")[0]
    with pytest.raises(FileNotFoundError, match=r"nope\.ar: no such file"):
        ArrayRecordSource(p0.replace("part-0", "nope") + "[0:1]")[0]


def test_gcs_read_instructions(files):
    with local_gcs(proxy=True) as bucket:
        urls = {p: bucket.upload(p, p.rsplit("/", 1)[1]) for p in files}
        named = [urls[files[0]] + "[1:4]", urls[files[1]] + "[0:2]"]
        before = bucket.proxy_stats.requests
        with ArrayRecordSource(named, storage_options=bucket.storage_options) as src:
            len(src)  # each: one GET for a file of the literal name (404), one for the tail
        assert bucket.proxy_stats.requests - before == 2 * len(named)
        for paths in _cases(files)[:3]:
            remote = [urls[p.rsplit("[", 1)[0]] + p[len(p.rsplit("[", 1)[0]):] if "[" in p
                      else urls[p] for p in paths]
            want = _oracle(paths)
            with ArrayRecordSource(remote, storage_options=bucket.storage_options) as src:
                assert src[:] == want
            ds = al.Dataset.from_arrayrecord(remote, storage_options=bucket.storage_options)
            assert list(ds) == want
