"""Bad input: each case a clear error that names the file, chunk or record; nothing hangs."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pathlib
import stat

import pytest

import aioloader as al
from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.io.storage import ObjectChangedError, StorageError
from aioloader.testing import local_gcs

from ..runtime.test_pipeline import _write
from ..support import pipeline_fns as fns
from ..support.arrayrecord_util import make_records, write_theirs


@pytest.fixture(scope="module")
def gcs():
    with local_gcs() as bucket:
        yield bucket


def _ids_pipeline(paths, **kw):
    return (al.Dataset.from_arrayrecord(paths, **kw).map(fns.decode)
            .map(fns.only_id_noise_det).batch(16))


async def _drain(ds, **kw):
    async with ds.loader(**kw) as it:
        return [b async for b in it]


def _corrupt_chunk_header(path, chunk=3):
    """Flip a byte inside data chunk `chunk`'s 40-byte header."""
    with al.ArrayRecordSource(str(path)) as src:
        start, _ = src.file_indices[0].chunk_range(chunk)
    data = bytearray(pathlib.Path(path).read_bytes())
    data[start + 12] ^= 0x40
    pathlib.Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["local", "gs"])
@pytest.mark.parametrize("workers", [0, 1])
async def test_corrupted_chunk_names_file_and_chunk(tmp_path, gcs, where, workers):
    paths = _write(tmp_path, n=60, shards=1)
    _corrupt_chunk_header(paths[0], chunk=3)
    url = paths[0] if where == "local" else gcs.upload(paths[0], f"corrupt-{workers}.ar")
    opts = {} if where == "local" else gcs.storage_options
    with pytest.raises(ArrayRecordFormatError, match=r"chunk 3.*header hash mismatch") as info:
        await _drain(_ids_pipeline([url], storage_options=opts), workers=workers)
    assert os.path.basename(url) in str(info.value)
    assert "re-create or re-upload" in str(info.value)


@pytest.mark.parametrize("where", ["local", "gs"])
@pytest.mark.parametrize("cut", [1, 70_000, 10**9])
async def test_truncated_and_empty_files(tmp_path, gcs, where, cut):
    paths = _write(tmp_path, n=30, shards=1)
    data = pathlib.Path(paths[0]).read_bytes()
    data = data[: max(0, len(data) - cut)]
    local = tmp_path / f"cut-{cut}.ar"
    local.write_bytes(data)
    url = str(local) if where == "local" else gcs.upload_bytes(data, f"cut-{cut}.ar")
    opts = {} if where == "local" else gcs.storage_options
    with pytest.raises(ArrayRecordFormatError, match=r"cut-\d+\.ar.*(truncated|too small)"):
        await al.ArrayRecordSource.open(url, storage_options=opts)


async def test_not_arrayrecord_and_empty_glob(tmp_path):
    (tmp_path / "x.ar").write_bytes(os.urandom(3 * 65536))
    with pytest.raises(ArrayRecordFormatError, match=r"x\.ar.*not an ArrayRecord file"):
        await _drain(_ids_pipeline([str(tmp_path / "x.ar")]))
    with pytest.raises(FileNotFoundError, match="no files match"):
        await _drain(_ids_pipeline(str(tmp_path / "none-*.ar")))


async def test_record_bigger_than_the_memory_budget(tmp_path):
    path = tmp_path / "big.ar"
    write_theirs(path, make_records(300_000, 3), "group_size:1,uncompressed")  # 300 KB chunks
    ds = al.Dataset.from_arrayrecord(str(path)).map(len).batch(3)
    with pytest.raises(StorageError, match=r"big\.ar.*larger than the memory budget"):
        await _drain(ds, memory_budget=100_000)
    assert [list(b) for b in await _drain(ds, memory_budget=4 << 20)] != []


@pytest.mark.parametrize("workers", [0, 1])  # the parent reads, or the worker does
@pytest.mark.parametrize("how", ["rewritten", "shrunk"])
async def test_local_file_changed_after_open(tmp_path, workers, how):
    paths = _write(tmp_path, n=200, shards=1)
    ds = _ids_pipeline(paths)
    async with ds.loader(prefetch=1, workers=workers) as it:
        await it.__anext__()
        if how == "rewritten":
            write_theirs(paths[0], make_records(500, 200, seed=9), "group_size:1")
        else:
            os.truncate(paths[0], 4096)  # cuts records of later batches
        with pytest.raises(ObjectChangedError, match=r"train-00000.*changed after it was"):
            async for _ in it:
                pass


async def test_object_replaced_after_open_is_detected(tmp_path, gcs):
    paths = _write(tmp_path, n=200, shards=1)
    url = gcs.upload(paths[0], "replaced.ar")
    other = tmp_path / "other.ar"
    write_theirs(other, make_records(100, 200, seed=3), "group_size:1")
    async with al.ArrayRecordSource(url, storage_options=gcs.storage_options) as src:
        first = await src.read([0])
        gcs.upload(other, "replaced.ar")  # a new generation under the same name
        with pytest.raises(ObjectChangedError, match=r"replaced\.ar was replaced or deleted"):
            await asyncio.wait_for(src.read([150]), 10)
    assert first


async def test_credentials_never_appear_in_errors_or_stats(tmp_path):
    url = "memory://alice:s3cr3t@bucket/data-*.ar"
    with pytest.raises(FileNotFoundError) as info:
        await al.ArrayRecordSource.open(url)
    assert "s3cr3t" not in str(info.value) and "***@" in str(info.value)


def _arenas() -> dict[int, str]:
    """The arena memory files this process holds: inode -> a path to one of its fds."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        path = f"/proc/self/fd/{fd}"
        with contextlib.suppress(OSError):
            if "aioloader-arena" in os.readlink(path):
                out[os.stat(path).st_ino] = path
    return out


def test_shared_memory_and_cache_files_are_private(tmp_path):
    paths = _write(tmp_path, n=64, shards=1)
    before = set(_arenas())  # (other tests' loaders that only a collection will close)
    it = iter(_ids_pipeline(paths).loader(workers=1))
    next(it)
    # memfds (not in /dev/shm), to which only their owner has access
    arenas = {k: v for k, v in _arenas().items() if k not in before}
    assert arenas and all(stat.S_IMODE(os.stat(a).st_mode) == 0o600 for a in arenas.values())
    assert not glob.glob(f"/dev/shm/aioloader-{os.getpid()}-*")
    it.close()
    assert not set(arenas) & set(_arenas())
    cache = tmp_path / "idx"
    with al.ArrayRecordSource(paths, index_cache_dir=cache) as src:
        len(src)
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
