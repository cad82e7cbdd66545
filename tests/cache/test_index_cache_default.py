"""The default index cache (`index_cache_dir="auto"`): gs:// datasets' indices kept in the
user's cache directory, bounded, least recently used out first; local files, None/False and
`AIOLOADER_INDEX_CACHE=off` keep none; a default directory others can write to is skipped."""

from __future__ import annotations

import os
import time

import pytest

import aioloader as al
from aioloader.cache import index_cache, indexdefault
from aioloader.cache.index_cache import IndexCache
from aioloader.source import ArrayRecordSource
from aioloader.testing import local_gcs

from ..support.arrayrecord_util import make_records, write_theirs

FILES = 12


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True) as bucket:
        yield bucket


@pytest.fixture(scope="module")
def shards(tmp_path_factory, gcs):
    root = tmp_path_factory.mktemp("default-index")
    records = []
    for k in range(FILES):
        path = root / f"part-{k:02d}.ar"
        recs = make_records(30, 40 + k, seed=k)
        write_theirs(path, recs, "group_size:1")
        gcs.upload(path, f"default-index/part-{k:02d}.ar")
        records += recs
    return root, gcs.url("default-index/*.ar"), records


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The user's cache directory, empty, and the default on (the suite turns it off)."""
    monkeypatch.delenv(indexdefault.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "aioloader" / "index"


def _entries(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(index_cache._SUFFIX)) \
        if os.path.isdir(directory) else []


def _open(url: str, gcs, **kw) -> tuple[list[bytes], dict]:
    src = ArrayRecordSource(url, storage_options=gcs.storage_options, **kw)
    try:
        got = [src[i] for i in range(len(src))]
        return got, src.storage.stats.as_dict()
    finally:
        src.close()


def test_a_remote_dataset_opens_from_the_default_cache_the_second_time(home, shards, gcs):
    _, url, records = shards
    first, opened = _open(url, gcs)
    assert first == records
    assert len(_entries(home)) == 1
    assert (os.stat(home).st_mode & 0o777) == 0o700
    again, reopened = _open(url, gcs)
    assert again == records
    # the first open read every footer; the second only listed, then read the records
    assert opened["requests"] - reopened["requests"] >= FILES


def test_a_loader_uses_it_too_and_the_batches_do_not_change(home, shards, gcs):
    _, url, records = shards
    ds = al.Dataset.from_arrayrecord(url, storage_options=gcs.storage_options).shuffle(3) \
        .batch(16)
    runs = []
    for _ in range(2):
        with ds.loader(workers=0) as it:
            runs.append([list(b) for b in it])
    assert runs[0] == runs[1]
    assert sorted(r for b in runs[0] for r in b) == sorted(records)
    assert len(_entries(home)) == 1


@pytest.mark.parametrize("how", ["none", "false", "env-off"])
def test_none_false_and_env_off_keep_no_cache(home, shards, gcs, monkeypatch, how):
    _, url, records = shards
    kw = {}
    if how == "none":
        kw["index_cache_dir"] = None
    elif how == "false":
        kw["index_cache_dir"] = False
    else:
        monkeypatch.setenv(indexdefault.ENV, "off")
    got, _ = _open(url, gcs, **kw)
    assert got == records
    assert not os.path.exists(home)


def test_the_loaders_flat_false_keeps_none(home, shards, gcs):
    _, url, records = shards
    ds = al.Dataset.from_arrayrecord(url, storage_options=gcs.storage_options).batch(16)
    with ds.loader(workers=0, index_cache_dir=False) as it:
        assert sorted(r for b in it for r in b) == sorted(records)
    assert not os.path.exists(home)


def test_the_environment_can_name_the_directory(tmp_path, shards, gcs, monkeypatch):
    _, url, _ = shards
    monkeypatch.setenv(indexdefault.ENV, str(tmp_path / "elsewhere"))
    _open(url, gcs)
    assert len(_entries(tmp_path / "elsewhere")) == 1


def test_local_files_are_not_cached_by_default(home, shards):
    root, _, records = shards
    src = ArrayRecordSource(str(root / "*.ar"))
    try:
        assert [src[i] for i in range(len(src))] == records
    finally:
        src.close()
    assert not os.path.exists(home)


def test_other_stores_are_not_cached_by_default(home, shards):
    """An fsspec store whose listing gives an mtime, not a generation (memory:// here): an
    entry could serve a same-size rewrite within the mtime's resolution, so none by default."""
    import fsspec

    root, _, records = shards
    mem = fsspec.filesystem("memory")
    for k in range(FILES):
        mem.pipe(f"/default-index/part-{k:02d}.ar", (root / f"part-{k:02d}.ar").read_bytes())
    try:
        src = ArrayRecordSource("memory://default-index/*.ar")
        try:
            assert [src[i] for i in range(len(src))] == records
        finally:
            src.close()
        assert not os.path.exists(home)
    finally:
        mem.rm("/default-index", recursive=True)


def test_a_default_directory_others_can_write_to_is_skipped_not_an_error(home, shards, gcs):
    _, url, records = shards
    os.makedirs(home)
    os.chmod(home, 0o777)
    got, _ = _open(url, gcs)
    assert got == records
    assert _entries(home) == []
    with pytest.raises(PermissionError, match="writable by group and others"):
        ArrayRecordSource(url, storage_options=gcs.storage_options, index_cache_dir=home)


def test_entries_past_the_bound_go_least_recently_used_first(tmp_path, shards, gcs):
    """Three datasets' entries in a cache bounded to about two: the one not used for the
    longest goes; one just loaded stays; an entry larger than the bound is not kept."""
    _, url, _ = shards
    base = url.rsplit("/", 1)[0]
    urls = [f"{base}/part-0{k}.ar" for k in range(3)]
    src = ArrayRecordSource(urls[0], storage_options=gcs.storage_options,
                            index_cache_dir=tmp_path / "probe")
    len(src)
    src.close()
    size = os.path.getsize(tmp_path / "probe" / _entries(tmp_path / "probe")[0])
    bounded = tmp_path / "bounded"
    cache = IndexCache(bounded, max_bytes=2 * size + size // 2)

    def open_with(u):
        s = ArrayRecordSource(u, storage_options=gcs.storage_options)
        s._index_cache = cache
        try:
            return len(s), s._table.from_index_cache
        finally:
            s.close()

    names = []
    for u in urls[:2]:
        open_with(u)
        (new,) = set(_entries(bounded)) - set(names)
        names.append(new)
        time.sleep(0.01)
    assert len(_entries(bounded)) == 2
    assert open_with(urls[0])[1]  # loaded: now the most recently used
    time.sleep(0.01)
    open_with(urls[2])
    left = set(_entries(bounded))
    assert len(left) == 2
    assert names[0] in left and names[1] not in left  # the second one went, not the first
    tiny = IndexCache(tmp_path / "tiny", max_bytes=size // 2)
    s = ArrayRecordSource(urls[0], storage_options=gcs.storage_options)
    s._index_cache = tiny
    len(s)
    s.close()
    assert _entries(tmp_path / "tiny") == []


def _entry(directory, name: str, size: int, age_s: float = 0.0) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b"x" * size)
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return name


def _bound(cache: IndexCache, new: str) -> None:
    fd = os.open(cache.directory, os.O_RDONLY)
    try:
        cache._bound(fd, new)
    finally:
        os.close(fd)


def test_an_entry_larger_than_the_bound_goes_alone(tmp_path):
    cache = IndexCache(tmp_path / "c", max_bytes=500)
    suffix = index_cache._SUFFIX
    older = [_entry(cache.directory, f"{c * 32}{suffix}", 100, age_s=60 - k)
             for k, c in enumerate("ab")]
    new = _entry(cache.directory, f"{'c' * 32}{suffix}", 1000)
    _bound(cache, new)
    assert _entries(cache.directory) == sorted(older)  # (it wiped them all before)


def test_a_killed_writers_old_temporaries_go_and_live_ones_stay(tmp_path):
    cache = IndexCache(tmp_path / "c", max_bytes=1 << 20)
    suffix = index_cache._SUFFIX
    name = f"{'d' * 32}{suffix}"
    old = _entry(cache.directory, f".{name}.{'1' * 16}.tmp", 10, age_s=2 * 3600)
    live = _entry(cache.directory, f".{name}.{'2' * 16}.tmp", 10)
    mine = _entry(cache.directory, "notes.tmp", 10, age_s=2 * 3600)  # (not ours: kept)
    new = _entry(cache.directory, name, 10)
    _bound(cache, new)
    left = set(os.listdir(cache.directory))
    assert old not in left and {live, mine, new} <= left


def test_a_relative_directory_in_the_environment_is_refused_with_a_warning(
        tmp_path, shards, gcs, monkeypatch, caplog):
    _, url, records = shards
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(indexdefault.ENV, "relative/idx")
    with caplog.at_level("WARNING", logger="aioloader"):
        got, _ = _open(url, gcs)
    assert got == records
    assert not (tmp_path / "relative").exists()
    assert "not an absolute path" in caplog.text
