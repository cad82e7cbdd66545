"""`src[i]`, one record at a time: what `src[[i]]` and array_record's own reader return, the
same errors for bad indices, damaged chunks and files changed after opening, from any
number of threads at once; on local files without a request through the storage layer."""

from __future__ import annotations

import os
import pathlib
import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.errors import ObjectChangedError, StorageError
from aioloader.io.storage import Storage
from aioloader.testing import local_gcs

from ..support.arrayrecord_util import CODECS, make_records, write_theirs

GROUPS = [1, 3, 64]
SHARDS = 2


def _theirs(paths: list[str]) -> list[bytes]:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    with ArrayRecordDataSource(paths) as theirs:
        return [theirs[i] for i in range(len(theirs))]


def _write(root: pathlib.Path, codec: str, group: int, count: int = 150) -> list[str]:
    """`SHARDS` files; a few records big enough that their chunks cross block boundaries."""
    records = make_records(200, count, seed=group)
    records[5] = make_records(70_000, 1, seed=5)[0]
    records[count - 2] = b""
    folder = root / f"{codec.replace(':', '')}-g{group}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(SHARDS):
        path = folder / f"part-{k}.ar"
        write_theirs(path, records[k::SHARDS], f"group_size:{group},{codec}")
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("one")
    out = {}
    for codec in CODECS:
        for group in GROUPS:
            paths = _write(root, codec, group)
            out[codec, group] = (paths, _theirs(paths))
    return out


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("codec", CODECS)
def test_every_record_as_a_list_and_array_record_read_it(datasets, codec, group):
    paths, want = datasets[codec, group]
    with al.ArrayRecordSource(paths) as src:
        assert len(src) == len(want)
        order = np.random.default_rng(group).permutation(len(want)).tolist()
        got = [src[i] for i in order]
        assert got == [want[i] for i in order]
        assert [src[i] for i in order] == got  # again: from the decoded-chunk cache
        assert [src[[i]][0] for i in order[:20]] == got[:20]
        assert src[np.int64(3)] == want[3]


@settings(max_examples=25, deadline=None)
@given(keys=st.lists(st.integers(-300, 299), min_size=1, max_size=40),
       group=st.sampled_from(GROUPS), cache_bytes=st.sampled_from([0, 2000, 256 << 20]))
def test_random_indices_negative_included(datasets, keys, group, cache_bytes):
    paths, want = datasets["zstd:3", group]
    n = len(want)
    with al.ArrayRecordSource(paths, cache_bytes=cache_bytes) as src:
        for k in keys:
            k = k % (2 * n) - n  # in [-n, n)
            assert src[k] == want[k]


def test_out_of_range_as_before(datasets):
    paths, want = datasets["zstd:3", 64]
    n = len(want)
    with al.ArrayRecordSource(paths) as src:
        assert src[-1] == want[-1] and src[-n] == want[0]
        for bad in (n, n + 10, -n - 1):
            with pytest.raises(IndexError, match=rf"out of range: the source has {n} records"):
                src[bad]


def _damage(path: str, chunk: int) -> None:
    """Flip a byte of chunk `chunk`'s data (its header still intact)."""
    with al.ArrayRecordSource(path) as src:
        _, end = src.file_indices[0].chunk_range(chunk)
    data = bytearray(pathlib.Path(path).read_bytes())
    data[end - 8] ^= 0x40
    pathlib.Path(path).write_bytes(bytes(data))


def _versionless(err: BaseException) -> str:
    return re.sub(r"version [\d.]+ -> [\d.]+", "version ...", str(err))


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.value


@pytest.mark.parametrize("group", [1, 64])
def test_damaged_chunk_is_the_same_clear_error(tmp_path, group):
    (path,) = _write(tmp_path, "zstd:3", group)[:1]
    _damage(path, chunk=1)
    i = 1 if group == 1 else 70  # a record of chunk 1 of the first file
    with al.ArrayRecordSource(path) as src:
        one = _error(lambda: src[i])
    with al.ArrayRecordSource(path) as src:
        listed = _error(lambda: src[[i]])
    assert isinstance(one, ArrayRecordFormatError)
    assert str(one) == str(listed)
    assert "part-0.ar" in str(one) and "chunk 1" in str(one)


@pytest.mark.parametrize("group", [1, 64])
@pytest.mark.parametrize("how", ["rewritten", "shrunk"])
def test_file_changed_after_open_is_the_same_version_error(tmp_path, group, how):
    (path,) = _write(tmp_path, "zstd:3", group)[:1]
    errors = []
    for key in (70, [70]):
        with al.ArrayRecordSource(path) as src:
            assert src[0]
            if how == "rewritten":
                write_theirs(path, make_records(500, 80, seed=9), f"group_size:{group}")
            else:
                os.truncate(path, 4096)
            errors.append(_error(lambda src=src, key=key: src[key]))
        _write(tmp_path, "zstd:3", group)  # as it was, for the next way
    one, listed = errors
    assert isinstance(one, ObjectChangedError)
    assert _versionless(one) == _versionless(listed)  # (each open saw another version)
    assert "part-0.ar changed after it was opened" in str(one)


def test_record_over_the_memory_budget_is_refused(tmp_path):
    path = tmp_path / "big.ar"
    write_theirs(path, make_records(300_000, 3), "group_size:1,uncompressed")
    storage = Storage(max_inflight_bytes=100_000)
    with al.ArrayRecordSource(str(path), storage=storage) as src:
        one = _error(lambda: src[1])
        listed = _error(lambda: src[[1]])
        src._sync(storage.aclose())
    assert isinstance(one, StorageError) and str(one) == str(listed)
    assert re.search(r"big\.ar.*larger than the memory budget", str(one))


@pytest.mark.parametrize("group", [1, 64])
def test_threads_reading_at_once_get_their_records(datasets, group):
    paths, want = datasets["snappy", group]
    n = len(want)
    with al.ArrayRecordSource(paths, cache_bytes=20_000) as src:  # evicting as they read
        wrong: list[tuple[int, int]] = []
        failed: list[BaseException] = []

        def reader(seed: int) -> None:
            try:
                for i in np.random.default_rng(seed).integers(-n, n, 400).tolist():
                    if src[i] != want[i]:
                        wrong.append((seed, i))
            except BaseException as err:  # (reported below)
                failed.append(err)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed and not wrong


@pytest.mark.parametrize("group", [1, 64])
def test_local_records_are_read_without_a_storage_request(datasets, group):
    paths, want = datasets["zstd:3", group]
    with al.ArrayRecordSource(paths) as src:
        len(src)
        before = src.storage.stats.requests
        assert [src[i] for i in range(0, len(want), 7)] == want[::7]
        assert src.storage.stats.requests == before


def test_gs_records_one_at_a_time(datasets):
    paths, want = datasets["zstd:3", 64]
    with local_gcs() as gcs:
        urls = [gcs.upload(p, f"one/{os.path.basename(p)}") for p in paths]
        with al.ArrayRecordSource(urls, storage_options=gcs.storage_options) as src:
            keys = np.random.default_rng(1).integers(-len(want), len(want), 30).tolist()
            assert [src[k] for k in keys] == [want[k] for k in keys]
            before = src.storage.stats.requests  # their chunks decoded: no request again
            assert [src[k] for k in keys[::-1]] == [want[k] for k in keys[::-1]]
            assert src.storage.stats.requests == before


def test_read_instructions_one_at_a_time(datasets):
    (a, b), _ = datasets["zstd:3", 3]
    (c, _), _ = datasets["uncompressed", 1]
    paths = [f"{b}[4:40]", a, f"{c}[7:7]", f"{a}[70:75]", f"{c}[0:2]"]
    want = _theirs(paths)
    with al.ArrayRecordSource(paths) as src:
        assert [src[i] for i in range(-len(want), len(want))] == want + want


@pytest.mark.parametrize("group", [1, 64])
@pytest.mark.parametrize("first", ["one", "list"])
def test_a_file_replaced_by_a_rename_after_open_is_never_read(tmp_path, group, first):
    """A dataset rebuilt with `mv` (another inode at the path, the same layout): one record
    at a time reads the file that was opened, as a list does, or both refuse it."""
    (path,) = _write(tmp_path, "zstd:3", group)[:1]
    old = _theirs([path])
    new = tmp_path / "new.ar"
    write_theirs(str(new), [b"NEW-" + r[4:] for r in old], f"group_size:{group}")
    with al.ArrayRecordSource(path, cache_bytes=0 if group > 1 else 256 << 20) as src:
        len(src)
        os.replace(new, path)
        keys = (5, [5]) if first == "one" else ([5], 5)
        got = []
        for key in keys:
            try:
                value = src[key]
                got.append(value if isinstance(key, int) else value[0])
            except ObjectChangedError:
                got.append("changed")
        assert b"NEW-" + old[5][4:] not in got
        assert got[0] == got[1]
