"""Opening many small files from a bucket: what it costs and that it stays exact.

A small remote ArrayRecord file (a few 64 KiB blocks) opens by what it declares, the
postscript's head then its footer, not by one read of most of the file; a footer larger
than the first footer read takes one more read; a postscript that lies fails as it does
locally, naming the object. With an index cache, opening the same files again is the
listing alone (the listing's generations and sizes are the entry's key), and a rewritten
object misses. Counted at the delay line in front of the emulator, over real HTTP.
"""

from __future__ import annotations

import dataclasses

import pytest

from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.arrayrecord.codecs import ZSTD
from aioloader.arrayrecord.index import FOOTER_PROBE, POSTSCRIPT_PROBE
from aioloader.formats.arrayrecord import SMALL_FILE
from aioloader.source import ArrayRecordSource
from aioloader.testing import ProxyStats, local_gcs

from ..support.arrayrecord_util import make_records, write_theirs
from ..support.hostile import honest

FILES = 24


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True) as bucket:
        yield bucket


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """FILES files of 2-3 blocks (60-83 records of ~1 KiB, group_size 1), and their records."""
    root = tmp_path_factory.mktemp("small")
    out = []
    for k in range(FILES):
        path = root / f"part-{k:02d}.ar"
        records = make_records(1000, 60 + k, seed=k)
        write_theirs(path, records, "group_size:1")
        assert path.stat().st_size <= SMALL_FILE
        out.append((path, records))
    return out


def _delta(before: ProxyStats, after: ProxyStats) -> dict[str, int]:
    return {f.name: getattr(after, f.name) - getattr(before, f.name)
            for f in dataclasses.fields(ProxyStats)}


def _upload(gcs, files, folder: str) -> str:
    for path, _ in files:
        gcs.upload(path, f"{folder}/{path.name}")
    return gcs.url(f"{folder}/part-*.ar")


async def _open(gcs, url: str, **kw) -> tuple[ArrayRecordSource, dict[str, int]]:
    before = gcs.proxy_stats
    src = await ArrayRecordSource.open(url, storage_options=gcs.storage_options, **kw)
    return src, _delta(before, gcs.proxy_stats)


async def test_small_files_open_by_their_footers_not_their_bytes(gcs, small):
    src, seen = await _open(gcs, _upload(gcs, small, "footers"))
    try:
        assert seen["requests"] == 1 + 2 * FILES  # the listing; the postscript, the footer
        assert seen["downloads"] == 2 * FILES == src.storage.stats.requests
        assert src.storage.stats.bytes <= FILES * (POSTSCRIPT_PROBE + FOOTER_PROBE)
        expected = [r for _, records in small for r in records]
        assert len(src) == len(expected)
        picks = [0, 59, 60, len(expected) // 2, len(expected) - 1]
        assert await src.read(picks) == [expected[i] for i in picks]
    finally:
        await src.aclose()


async def test_a_footer_larger_than_the_first_read_takes_one_more(gcs, small, tmp_path):
    big = tmp_path / "part-big.ar"  # 3,000 chunks: a footer of ~24 KB in ~4 blocks
    records = make_records(20, 3000, seed=5)
    write_theirs(big, records, "group_size:1,uncompressed")
    assert big.stat().st_size <= SMALL_FILE
    src, seen = await _open(gcs, _upload(gcs, [small[0], (big, records)], "larger"))
    try:
        assert seen["downloads"] == 2 + 3
        ix = src.file_indices[1]
        assert ix.size - 64 * 1024 - ix.footer_offset > FOOTER_PROBE
        assert len(src) == len(small[0][1]) + 3000
        assert await src.read([len(src) - 1, len(small[0][1])]) == [records[-1], records[0]]
    finally:
        await src.aclose()


@pytest.mark.parametrize("lie", [lambda o: o - 24, lambda o: o + 24, lambda o: 64])
async def test_a_lying_postscript_fails_as_locally_naming_the_object(gcs, tmp_path, lie):
    data = honest(make_records(300, 40, seed=1), ZSTD, 1, footer_offset=lie)
    assert len(data) <= SMALL_FILE
    local = tmp_path / "part-lie.ar"
    local.write_bytes(data)
    with pytest.raises(ArrayRecordFormatError) as here:
        await ArrayRecordSource.open(str(local))
    url = gcs.upload_bytes(data, "lies/part-lie.ar")
    with pytest.raises(ArrayRecordFormatError) as there:
        await ArrayRecordSource.open(gcs.url("lies/part-*.ar"),
                                     storage_options=gcs.storage_options)
    assert url in str(there.value)
    assert str(there.value).replace(url, "F") == str(here.value).replace(str(local), "F")


async def test_a_cached_open_is_the_listing_alone_and_a_rewrite_misses(gcs, small, tmp_path):
    url = _upload(gcs, small, "cached")
    kw = {"index_cache_dir": tmp_path / "idx"}
    src, _ = await _open(gcs, url, **kw)
    await src.aclose()
    src, seen = await _open(gcs, url, **kw)
    try:
        assert src.table.from_index_cache
        assert seen["requests"] == 1 and seen["downloads"] == 0  # no request per file
        assert await src.read([0]) == [small[0][1][0]]
    finally:
        await src.aclose()
    path, records = small[1]
    gcs.upload(path, f"cached/{path.name}")  # the same bytes, a new generation: a miss
    src, seen = await _open(gcs, url, **kw)
    await src.aclose()
    assert not src.table.from_index_cache and seen["downloads"] > 0
    gcs.upload(small[2][0], f"cached/{path.name}")  # other records
    src, seen = await _open(gcs, url, **kw)
    try:
        assert not src.table.from_index_cache and seen["downloads"] > 0
        start = len(small[0][1])
        assert len(src) == sum(len(r) for _, r in small) - len(records) + len(small[2][1])
        assert await src.read([start]) == [small[2][1][0]]
    finally:
        await src.aclose()
