"""The footer index cache on disk: one mapped table per set of files, checked before use,
written privately."""

from __future__ import annotations

import dataclasses
import json
import logging
import mmap
import os
import shutil
import stat

import numpy as np
import pytest

import aioloader as al
from aioloader.cache import index_cache

from ..support.arrayrecord_util import make_records, write_theirs

SHARDS = 2
PER_SHARD = 50
NO_HEADS = np.zeros((1, index_cache.HEAD_BYTES), dtype=np.uint8)  # for one file


@pytest.fixture
def data(tmp_path):
    """Two files whose indices differ (another record size each)."""
    paths, expected = [], []
    for k in range(SHARDS):
        records = make_records(100 + 60 * k, PER_SHARD, seed=k)
        path = tmp_path / f"d-{k}.ar"
        write_theirs(path, records, "group_size:1,zstd:3")
        paths.append(str(path))
        expected += records
    return paths, expected


def _entries(cache) -> list[str]:
    return sorted(n for n in os.listdir(cache) if n.endswith(".idx"))


def _open(paths, cache):
    """Open, read everything, and return (len, records, requests made to open)."""
    with al.ArrayRecordSource(paths, index_cache_dir=cache) as src:
        n = len(src)
        requests = src.storage.stats.requests
        return n, list(src), requests


def _load_raw(entry) -> tuple[dict, dict]:
    """An entry's header and arrays (copies), as a person with the format at hand reads it."""
    with open(entry, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[8:16], "little")
    header = json.loads(data[16 : 16 + n])
    arrays = {name: np.frombuffer(data, dtype=dt, count=length, offset=16 + n + at).copy()
              for name, (dt, at, length) in header["arrays"].items()}
    return header, arrays


def _save_raw(entry, header: dict, arrays: dict) -> None:
    """Write an entry back in the same layout, keeping its (now stale) digest."""
    places, at, body = {}, 0, b""
    for name, a in arrays.items():
        places[name] = [a.dtype.str, at, len(a)]
        raw = a.tobytes() + b"\0" * (-a.nbytes % 64)
        body += raw
        at += len(raw)
    header = {**header, "arrays": places}
    text = json.dumps(header).encode()
    text += b" " * (-(16 + len(text)) % 64)
    with open(entry, "wb") as f:
        f.write(index_cache._MAGIC + len(text).to_bytes(8, "little") + text + body)


def _rewrite(entry, change) -> None:
    """Edit a cached entry as a person or a bad tool would: valid layout, old checksum."""
    header, arrays = _load_raw(entry)
    change(header, arrays)
    _save_raw(entry, header, arrays)


def _drop_last_chunk(header, a):
    a["bounds"] = np.delete(a["bounds"], -2)
    a["decoded"] = a["decoded"][:-1]
    header["files"][-1][1] -= 1


def _zero_counts(header, a):
    header["files"][0][2] = True
    a["counts"] = np.zeros(header["files"][0][1], dtype="<i8")


@pytest.mark.parametrize("change", [_drop_last_chunk, _zero_counts], ids=["drop", "zero"])
def test_an_edited_entry_is_ignored_with_a_warning_and_rebuilt(tmp_path, data, caplog, change):
    paths, expected = data
    cache = tmp_path / "idx"
    assert _open(paths, cache)[:2] == (len(expected), expected)
    entries = _entries(cache)
    assert len(entries) == 1  # one table for the files opened together
    _rewrite(cache / entries[0], change)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        n, got, requests = _open(paths, cache)
    assert (n, got) == (len(expected), expected)
    assert any(entries[0] in r.getMessage() and "checksum" in r.getMessage()
               for r in caplog.records), caplog.text
    caplog.clear()
    # Rebuilt: the next open is served from the cache again, silently (one read of each
    # file's footer head, the check of a local file's footer).
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        n, got, requests = _open(paths, cache)
    assert (n, got, requests) == (len(expected), expected, SHARDS)
    assert not caplog.records


def test_entries_are_private_files_and_a_planted_temporary_is_not_written_through(tmp_path,
                                                                                   data):
    paths, expected = data
    names = _entries(_first_cache(tmp_path, paths))
    cache = tmp_path / "idx"
    cache.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in names:  # the temporary names the cache used to write through
        os.symlink(victim, cache / f"{name}.{os.getpid()}.tmp")
    assert _open(paths, cache)[:2] == (len(expected), expected)
    assert victim.read_bytes() == b"precious"
    for name in _entries(cache):
        st = os.lstat(cache / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def _first_cache(tmp_path, paths):
    first = tmp_path / "first"
    _open(paths, first)
    return first


def test_a_symlink_at_an_entry_name_is_not_followed(tmp_path, data, caplog):
    paths, expected = data
    cache = _first_cache(tmp_path, paths)
    name = _entries(cache)[0]
    elsewhere = tmp_path / "elsewhere.idx"
    os.replace(cache / name, elsewhere)
    _rewrite(elsewhere, _drop_last_chunk)
    before = elsewhere.read_bytes()
    os.symlink(elsewhere, cache / name)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        assert _open(paths, cache)[:2] == (len(expected), expected)
    assert any(name in r.getMessage() for r in caplog.records), caplog.text
    assert elsewhere.read_bytes() == before  # never written through
    assert stat.S_ISREG(os.lstat(cache / name).st_mode)  # replaced by a real entry


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o720])
def test_a_cache_directory_others_can_write_is_refused(tmp_path, data, mode):
    paths, _ = data
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(mode)
    with pytest.raises(PermissionError, match=rf"{cache}.*writable by.*chmod go-w"):
        _open(paths, cache)
    assert os.listdir(cache) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_a_cache_directory_owned_by_someone_else_is_refused(tmp_path, data):
    paths, _ = data
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o755)
    os.chown(cache, 65534, 65534)
    with pytest.raises(PermissionError, match=rf"{cache}.*owned by"):
        _open(paths, cache)


def test_an_entry_copied_over_another_files_entry_is_not_used(tmp_path, data, caplog):
    paths, expected = data
    cache = tmp_path / "idx"
    _open(paths[:1], cache)
    first = _entries(cache)
    _open(paths[1:], cache)
    second = [n for n in _entries(cache) if n not in first]
    shutil.copyfile(cache / first[0], cache / second[0])  # one file's table under both names
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        assert _open(paths[1:], cache)[:2] == (PER_SHARD, expected[PER_SHARD:])
    assert second[0] in caplog.text and "other files" in caplog.text


def test_a_valid_checksum_does_not_excuse_an_impossible_index(tmp_path, data, caplog):
    from aioloader.cache.index_cache import IndexCache

    paths, _ = data
    cache = IndexCache(tmp_path / "idx")
    with al.ArrayRecordSource(paths[0]) as src:
        good = src.file_indices[0]
    info = _info(paths[0])
    assert cache.load([info]) is None
    cache.store([info], [good], NO_HEADS)
    assert cache.load([info]).indices[0].num_records == PER_SHARD
    for bad in (dict(chunk_offsets=good.chunk_offsets[::-1].copy()),
                dict(chunk_records=-good.chunk_records),
                dict(chunk_records=np.full(good.num_chunks, 1 << 40)),
                dict(footer_offset=good.size + 10)):
        cache.store([info], [dataclasses.replace(good, **bad)], NO_HEADS)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aioloader"):
            assert cache.load([info]) is None
        assert "ignored: its" in caplog.text and "does not match" not in caplog.text


def test_a_symlink_at_the_temporary_name_is_never_written_through(tmp_path, data, monkeypatch,
                                                                   caplog):
    import aioloader.cache.index_cache as ic

    paths, _ = data
    cache = ic.IndexCache(tmp_path / "idx")
    with al.ArrayRecordSource(paths[0]) as src:
        index = src.file_indices[0]
    info = _info(paths[0])
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    monkeypatch.setattr(ic.secrets, "token_hex", lambda n: "guessed")
    name = _key_name(info)
    os.symlink(victim, tmp_path / "idx" / f".{name}.guessed.tmp")
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        cache.store([info], [index], NO_HEADS)
    assert victim.read_bytes() == b"precious"
    assert "not written" in caplog.text
    assert cache.load([info]) is None


def _info(path):
    from aioloader.io.backends import local_version
    from aioloader.io.storage import ObjectInfo

    return ObjectInfo(path, os.path.getsize(path), local_version(os.stat(path)))


def _key_name(info):
    import aioloader.cache.index_cache as ic

    return ic._name([info])


def _mapped(a: np.ndarray) -> bool:
    while a is not None and not isinstance(a, mmap.mmap):
        a = a.obj if isinstance(a, memoryview) else a.base
    return isinstance(a, mmap.mmap)


def test_a_cached_table_is_mapped_shared_and_answers_alike(tmp_path, data):
    paths, expected = data
    cache = tmp_path / "idx"
    with al.ArrayRecordSource(paths) as plain:
        want = plain.table.chunk_refs(np.arange(len(plain)))
        plain_indices = plain.file_indices
    _open(paths, cache)
    with al.ArrayRecordSource(paths, index_cache_dir=cache) as a, \
            al.ArrayRecordSource(paths, index_cache_dir=cache) as b:
        assert list(a) == expected and list(b) == expected
        for src in (a, b):
            bounds = src.table._chunks.bounds
            assert _mapped(bounds) and not bounds.flags.writeable
            assert all(_mapped(ix.chunk_offsets) and _mapped(ix.chunk_ends)
                       for ix in src.file_indices)
            got = src.table.chunk_refs(np.arange(len(src)))
            for field in ("file", "chunk", "start", "end", "within", "count"):
                assert np.array_equal(getattr(got, field), getattr(want, field)), field
            for ix, ref in zip(src.file_indices, plain_indices):
                assert ix.footer_offset == ref.footer_offset
                assert ix.writer_options == ref.writer_options
                assert np.array_equal(ix.chunk_decoded_sizes, ref.chunk_decoded_sizes)
                assert np.array_equal(ix.chunk_records, ref.chunk_records)


def test_a_truncated_entry_is_ignored_and_a_rewritten_file_misses(tmp_path, data, caplog):
    paths, expected = data
    cache = tmp_path / "idx"
    _open(paths, cache)
    (name,) = _entries(cache)
    size = os.path.getsize(cache / name)
    os.truncate(cache / name, size - 100)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        assert _open(paths, cache)[:2] == (len(expected), expected)
    assert "outside it" in caplog.text
    # A file rewritten (another version): its table is built from the files again, and
    # replaces the stale entry.
    records = make_records(90, PER_SHARD + 5, seed=9)
    write_theirs(paths[1], records, "group_size:4,zstd:3")
    n, got, requests = _open(paths, cache)
    assert (n, got) == (PER_SHARD * 2 + 5, expected[:PER_SHARD] + records) and requests > 4
    assert _entries(cache) == [name]
    assert _open(paths, cache)[1:] == (got, SHARDS)


def _same_size_rewrite(path: str) -> list[bytes]:
    """Rewrite `path` in place with other records (another chunk layout) of the same file
    size, and put its mtime back, as `rsync -a`, `cp -p` or a rewrite within one clock tick
    leave it; the new records."""
    st = os.stat(path)
    records = make_records(333, 17, seed=77)
    write_theirs(path, records, "group_size:1,uncompressed")
    assert os.path.getsize(path) == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return records


def test_a_same_size_rewrite_with_its_mtime_restored_is_read_anew(tmp_path, data):
    """The entry of a file rewritten with its size and mtime kept is stale: it is dropped
    (replaced by the rebuilt table), and the new records are read, not a corruption error
    blamed on a good file."""
    paths, expected = data
    cache = tmp_path / "idx"
    _open(paths, cache)
    (name,) = _entries(cache)
    old = (cache / name).read_bytes()
    new = _same_size_rewrite(paths[0])
    n, got, _ = _open(paths, cache)
    assert (n, got) == (len(new) + PER_SHARD, new + expected[PER_SHARD:])
    assert _entries(cache) == [name] and (cache / name).read_bytes() != old
    assert _open(paths, cache)[:2] == (n, got)


def _stale_entry(tmp_path, path: str, heads_from: str) -> tuple[list[bytes], object]:
    """The entry a rewrite that no version shows leaves (as within one clock tick): bound
    to the file as it is now, holding the index of the file before; its footer head taken
    from the old file (`heads_from="old"`) or from the new one at the old footer offset
    (`"new"`: the check passes, the index is still wrong). The new records, and the cache."""
    from aioloader.cache.index_cache import HEAD_BYTES, IndexCache

    with al.ArrayRecordSource(path) as src:
        old = src.file_indices[0]
    at = old.footer_offset

    def head() -> np.ndarray:
        with open(path, "rb") as f:
            f.seek(at)
            return np.frombuffer(f.read(HEAD_BYTES), dtype=np.uint8)[None]

    old_head = head()
    new = _same_size_rewrite(path)
    cache = IndexCache(tmp_path / "idx")
    cache.store([_info(path)], [old], old_head if heads_from == "old" else head())
    assert cache.load([_info(path)]) is not None
    return new, cache


def test_an_entry_whose_footer_head_differs_from_the_files_is_dropped(tmp_path, data,
                                                                      caplog):
    paths, _ = data
    new, cache = _stale_entry(tmp_path, paths[0], heads_from="old")
    with caplog.at_level(logging.INFO, logger="aioloader"):
        assert _open(paths[0], cache.directory)[:2] == (len(new), new)
    assert "dropped: a file's footer is not the one it holds" in caplog.text
    assert _open(paths[0], cache.directory)[:2] == (len(new), new)


@pytest.mark.parametrize("how", ["source", "loader"])
def test_a_stale_index_no_check_caught_is_reported_as_a_rewrite_and_dropped(tmp_path, data,
                                                                            how):
    """A record read through a stale cached index fails as corrupt: the entry is dropped,
    the footer read again, and the error says the file was rewritten (not damaged); the
    next open reads the new records."""
    from aioloader.errors import ObjectChangedError

    paths, _ = data
    new, cache = _stale_entry(tmp_path, paths[0], heads_from="new")
    with pytest.raises(ObjectChangedError, match=r"d-0\.ar was rewritten after its index was "
                                                 r"cached.*entry was dropped"):
        if how == "source":
            _open(paths[0], cache.directory)
        else:
            ds = al.Dataset.from_arrayrecord(paths[0]).batch(4)
            list(ds.loader(workers=0, index_cache_dir=cache.directory))
    assert _entries(cache.directory) == []
    assert _open(paths[0], cache.directory)[:2] == (len(new), new)


@pytest.fixture
def web(tmp_path):
    """A plain HTTP server of a directory (aiohttp's static files: ETags made of the mtime
    and size, as nginx and Apache make them), on a thread."""
    import asyncio
    import threading

    from aiohttp import web as aioweb

    root = tmp_path / "www"
    root.mkdir()
    loop = asyncio.new_event_loop()
    app = aioweb.Application()
    app.router.add_static("/", str(root))
    runner = aioweb.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_a_same_size_rewrite_that_keeps_its_version_is_not_served_stale(tmp_path, web):
    """A web server's ETag (mtime and size) does not prove the content: a file rewritten
    with one more record, padded to the same size, its mtime kept (`rsync -a`), is read
    anew, not through the entry of the old one (which lost the record, silently)."""
    root, base = web
    path = root / "part-0.ar"
    old = [b"a" * 300, b"b" * 300]
    new = [*old, b"c" * 200]
    write_theirs(path, old, "group_size:1")
    st = os.stat(path)
    url = f"{base}/part-0.ar"
    cache = tmp_path / "cache"
    src = al.ArrayRecordSource(url, index_cache_dir=cache)
    assert [src[i] for i in range(len(src))] == old
    src.close()
    write_theirs(path, new, "group_size:1")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size  # (the same size: padded to its blocks)
    src = al.ArrayRecordSource(url, index_cache_dir=cache)
    try:
        assert len(src) == 3
        assert [src[i] for i in range(len(src))] == new
        assert not src._table.from_index_cache
    finally:
        src.close()


def test_only_a_gs_generation_proves_an_objects_content():
    from aioloader.io.backends import ObjectInfo

    assert not index_cache.checked(ObjectInfo("gs://b/x.ar", 10, "1712345678901234"))
    for info in (ObjectInfo("gs://b/x.ar", 10, ""), ObjectInfo("/data/x.ar", 10, "1.2.3.4"),
                 ObjectInfo("http://h/x.ar", 10, '"5f-1a0"'),
                 ObjectInfo("s3://b/x.ar", 10, "2026-11-28 06:00:00"),
                 ObjectInfo("memory://x.ar", 10, "")):
        assert index_cache.checked(info), info
