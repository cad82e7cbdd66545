"""Opening many small files from a bucket: what it costs and that it stays exact.

Each remote ArrayRecord file opens in one request of the 128 KiB that holds any footer of
up to 64 KiB wherever it ends, or more once a larger footer was seen, never less: a read
narrowed to the small footers seen first would cost every later file with a larger footer
a second request, and the open is bound by requests. (A footer larger than the read takes
one more: tests/io/test_open_gcs.py.) A postscript that lies fails as
it does locally, naming the object. With an index cache, opening the same files again is
the listing alone (the listing's generations and sizes are the entry's key), and a
rewritten object misses. Counted at the delay line in front of the emulator, over real
HTTP.
"""

from __future__ import annotations

import dataclasses
import random
import types

import pytest

from aioloader.arrayrecord import ArrayRecordFormatError, read_index
from aioloader.arrayrecord.codecs import ZSTD
from aioloader.arrayrecord.index import POSTSCRIPT_PROBE
from aioloader.arrayrecord.layout import BLOCK_SIZE
from aioloader.io.storage import Storage
from aioloader.source import ArrayRecordSource, opening
from aioloader.source.opening import FIRST_SPAN, PAD_SLACK
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
    """FILES files of 3-4 blocks (150-173 random records of 1 KB, group_size 1), and their
    records."""
    root = tmp_path_factory.mktemp("small")
    out = []
    for k in range(FILES):
        path = root / f"part-{k:02d}.ar"
        rng = random.Random(k)
        records = [rng.randbytes(1000) for _ in range(150 + k)]
        write_theirs(path, records, "group_size:1")
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


async def test_small_files_open_in_one_request_each(gcs, small):
    """Four at once, each file's one read holds any footer of up to 64 KiB."""
    storage = Storage(storage_options=gcs.storage_options, concurrency=4)
    before = gcs.proxy_stats
    src = await ArrayRecordSource.open(_upload(gcs, small, "footers"), storage=storage)
    try:
        seen = _delta(before, gcs.proxy_stats)
        assert seen["requests"] == 1 + FILES  # the listing; one read a file
        assert seen["downloads"] == FILES == storage.stats.requests
        assert storage.stats.bytes <= FILES * (FIRST_SPAN + POSTSCRIPT_PROBE)
        expected = [r for _, records in small for r in records]
        assert len(src) == len(expected)
        picks = [0, 59, 60, len(expected) // 2, len(expected) - 1]
        assert await src.read(picks) == [expected[i] for i in picks]
    finally:
        await storage.aclose()


@pytest.mark.parametrize("lie", [lambda o: o - 24, lambda o: o + 24, lambda o: 64])
async def test_a_lying_postscript_fails_as_locally_naming_the_object(gcs, tmp_path, lie):
    data = honest(make_records(300, 40, seed=1), ZSTD, 1, footer_offset=lie)
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


def test_the_first_read_never_narrows_below_any_64_kib_footer_and_widens_past_them(small):
    """Small footers seen first leave later reads at FIRST_SPAN (a later footer of up to
    64 KiB still opens in one request: footers that grow from file to file); a footer that
    needs more widens them; an index that knows only its footer and padding together (a
    small-reads open, another format) only ever widens them too."""
    data = small[0][0].read_bytes()

    def fetch(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    opener = opening._Opener(Storage(), "headers")
    assert opener._span() == FIRST_SPAN
    spanned = read_index(len(data), fetch, span=FIRST_SPAN)
    opener.learn(spanned)
    assert opener._span() == FIRST_SPAN
    for need in (10_685, 47_282):  # later, larger footers (of up to 64 KiB): still FIRST_SPAN
        opener.learn(types.SimpleNamespace(size=1 << 20, footer_offset=0, footer_need=need))
        assert opener._span() == FIRST_SPAN
    opener.learn(types.SimpleNamespace(size=1 << 20, footer_offset=0, footer_need=200_000))
    assert opener._span() == 200_000 + BLOCK_SIZE + PAD_SLACK  # (a footer past 64 KiB)
    by_small_reads = read_index(len(data), fetch, small_reads=True)
    assert "footer_need" not in vars(by_small_reads)
    opener.learn(by_small_reads)
    assert opener._span() >= FIRST_SPAN
