"""The loader's opening settings: `index_cache_dir` (the footer index kept on disk) and
`gcs_client` (which client serves gs:// reads), given flat or in `ReadOptions`."""

from __future__ import annotations

import contextlib
import os

import pytest

import aioloader as al
from aioloader import formats
from aioloader.io.gcs.client import GcsfsBackend
from aioloader.io.storage import Storage
from aioloader.options import GCS_CLIENTS
from aioloader.testing import local_gcs


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("open-options")
    for k in range(3):
        with al.ArrayRecordWriter(root / f"part-{k}.array_record", group_size=1) as w:
            for i in range(20):
                w.write(f"{k}-{i}".encode())
    return str(root / "part-*.array_record")


def _records(loader) -> list[bytes]:
    with loader:
        return [r for batch in loader for r in batch]


def _private(tmp_path) -> str:
    d = tmp_path / "index"
    d.mkdir(mode=0o700)
    return str(d)


def test_a_loader_with_index_cache_dir_fills_the_cache_then_opens_from_it(
        files, tmp_path, monkeypatch):
    cache = _private(tmp_path)
    ds = al.Dataset.from_arrayrecord(files).shuffle(seed=1).batch(7)
    first = _records(ds.loader(index_cache_dir=cache))
    entries = os.listdir(cache)
    assert len(entries) == 1 and entries[0].endswith(".idx")  # one table for all three files

    def no_footer_reads(*args, **kw):
        raise AssertionError("a filled index cache should spare every footer read")

    monkeypatch.setattr(formats.get("arrayrecord"), "open_index", no_footer_reads)
    read = al.ReadOptions(index_cache_dir=cache)
    assert _records(ds.loader(read=read)) == first
    assert os.listdir(cache) == entries
    assert sorted(first) == sorted(f"{k}-{i}".encode() for k in range(3) for i in range(20))


@pytest.mark.parametrize("value, error, match", [
    (123, TypeError, r"index_cache_dir must be a path or None, got int"),
    ("", ValueError, r"index_cache_dir must name a directory"),
])
def test_a_bad_index_cache_dir_is_named(files, value, error, match):
    with pytest.raises(error, match=match):
        al.Dataset.from_arrayrecord(files).loader(index_cache_dir=value)


def test_an_index_cache_dir_others_can_write_is_refused_when_the_loader_opens(files, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    loader = al.Dataset.from_arrayrecord(files).batch(5).loader(index_cache_dir=shared)
    with pytest.raises(PermissionError, match="index"), loader:
        next(iter(loader))


def test_gcs_client_is_checked_and_kept(files):
    assert GCS_CLIENTS == ("auto", "curl", "fsspec")
    with pytest.raises(ValueError, match=r"gcs_client must be one of 'auto', 'curl', "
                                         r"'fsspec' or None .*got 'h2'"):
        al.Dataset.from_arrayrecord(files).loader(gcs_client="h2")
    loader = al.Dataset.from_arrayrecord(files).loader(gcs_client="fsspec")
    assert loader.options.read.gcs_client == "fsspec"
    assert al.ReadOptions().gcs_client is None  # AIOLOADER_GCS_CLIENT, else "auto"


def test_the_removed_aiohttp_client_is_read_through_fsspec_with_a_warning(files, monkeypatch):
    with pytest.warns(DeprecationWarning, match="gcs_client='fsspec'") as seen:
        loader = al.Dataset.from_arrayrecord(files).loader(gcs_client="aiohttp")
    assert loader.options.read.gcs_client == "fsspec"
    assert [w.filename for w in seen] == [__file__]  # the caller's line: shown by default
    with pytest.warns(DeprecationWarning, match="gcs_client='fsspec'"):
        assert al.ReadOptions(gcs_client="aiohttp").gcs_client == "fsspec"
    monkeypatch.setenv("AIOLOADER_GCS_CLIENT", "aiohttp")
    with pytest.warns(DeprecationWarning, match="AIOLOADER_GCS_CLIENT='aiohttp'"):
        assert Storage().stores.gcs_client == "fsspec"


@pytest.mark.parametrize("client", ["fsspec", "aiohttp"])
def test_a_loader_reads_gs_through_the_client_it_names(tmp_path, monkeypatch, client):
    monkeypatch.setenv("AIOLOADER_GCS_CLIENT", "curl")  # the option wins over it
    with local_gcs() as gcs:
        path = tmp_path / "one.array_record"
        with al.ArrayRecordWriter(path, group_size=1) as w:
            for i in range(10):
                w.write(b"%d" % i)
        url = gcs.upload(path, "one.array_record")
        ds = al.Dataset.from_arrayrecord(url, storage_options=gcs.storage_options).batch(5)
        with pytest.warns(DeprecationWarning) if client == "aiohttp" else _nothing():
            loader = ds.loader(gcs_client=client, resident_bytes=0)
        got, backends = [], []
        with loader:
            for batch in loader:
                storage = loader._parts.source.storage
                backends = backends or [b for state in storage.stores._states.values()
                                        for b in state.backends.values()]
                got.extend(batch)
        assert got == [b"%d" % i for i in range(10)]
        assert storage.stores.gcs_client == "fsspec"
        assert backends and all(type(b) is GcsfsBackend for b in backends)


@contextlib.contextmanager
def _nothing():
    yield
