"""Opening gs:// files: how many HTTP requests it costs, counted at the delay line.

A file named without a glob opens with one suffix-range GET (tail bytes, size and generation in
one answer); a glob costs one listing then one tail read per file, with no per-file metadata
lookup. Every figure is counted by the delay line in front of fake-gcs-server over real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.arrayrecord.layout import BLOCK_SIZE
from aioloader.io.storage import ObjectChangedError, RetryPolicy, Storage, StorageError
from aioloader.source import ArrayRecordSource
from aioloader.source import opening as source_table
from aioloader.testing import ProxyStats, local_gcs

from ..support.arrayrecord_util import make_records, write_theirs

FILES = 20


@pytest.fixture(scope="module")
def gcs():
    with local_gcs(proxy=True) as bucket:
        yield bucket


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """20 small files (two 64 KiB blocks each) and one of ~2.5 MB."""
    root = tmp_path_factory.mktemp("open")
    out = []
    for k in range(FILES):
        path = root / f"part-{k:02d}.ar"
        records = make_records(100, 50 + k, seed=k)
        write_theirs(path, records, "group_size:1")
        out.append((path, records))
    big = root / "big.ar"
    records = make_records(1000, 2500, seed=99)
    write_theirs(big, records, "group_size:1,uncompressed")
    assert big.stat().st_size > 2 * source_table.CLOUD_SPAN
    out.append((big, records))
    return out


def _delta(before: ProxyStats, after: ProxyStats) -> dict[str, int]:
    fields = [f.name for f in dataclasses.fields(ProxyStats)]
    return {k: getattr(after, k) - getattr(before, k) for k in fields}


async def _open_counted(gcs, paths, **kw) -> tuple[ArrayRecordSource, dict[str, int]]:
    before = gcs.proxy_stats
    src = await ArrayRecordSource.open(paths, storage_options=gcs.storage_options, **kw)
    return src, _delta(before, gcs.proxy_stats)


async def test_twenty_named_objects_open_in_twenty_requests(gcs, shards):
    urls = [gcs.upload(p, f"named/{p.name}") for p, _ in shards[:FILES]]
    src, seen = await _open_counted(gcs, urls)
    try:
        assert seen["requests"] == FILES  # no metadata lookups: one GET per file
        assert seen["downloads"] == FILES
        assert src.storage.stats.requests == FILES and src.storage.stats.retries == 0
        assert src.urls == urls
        expected = [r for _, records in shards[:FILES] for r in records]
        assert len(src) == len(expected)
        picks = [0, 49, 50, len(expected) // 2, len(expected) - 1]
        assert await src.read(picks) == [expected[i] for i in picks]
    finally:
        await src.aclose()


async def test_size_and_generation_match_the_metadata(gcs, shards):
    path, _ = shards[-1]  # bigger than the suffix read: a 206 for its last bytes
    url = gcs.upload(path, "meta/big.ar")
    src, seen = await _open_counted(gcs, url)
    try:
        assert seen["requests"] == 1
        meta = await src.storage.info(url)  # gcsfs's metadata lookup, for comparison
        (info,) = src.table.files
        assert info == meta and info.size == path.stat().st_size and info.version
        assert src.storage.stores.pins[url] == info.version  # reads are pinned to it
        assert src.file_indices[0].size == info.size
    finally:
        await src.aclose()


async def test_glob_opens_with_one_listing_and_one_read_per_file(gcs, shards):
    for p, _ in shards[:FILES]:
        gcs.upload(p, f"globbed/{p.name}")
    src, seen = await _open_counted(gcs, gcs.url("globbed/part-*.ar"))
    try:
        assert seen["downloads"] == FILES == src.storage.stats.requests
        assert seen["requests"] - seen["downloads"] == 1  # the listing; no per-file info()
        assert len(src.urls) == FILES
    finally:
        await src.aclose()


async def test_a_glob_reads_each_footer_and_postscript_head_not_whole_tails(gcs, shards):
    """Each file's one read is its footer's span and the postscript's head: for these
    two-block files about half the file (the whole file was read before: 128 KiB)."""
    for p, _ in shards[:FILES]:
        gcs.upload(p, f"spans/{p.name}")
    src, seen = await _open_counted(gcs, gcs.url("spans/part-*.ar"))
    try:
        assert seen["downloads"] == FILES
        per_file = src.storage.stats.bytes / FILES
        assert per_file < BLOCK_SIZE + 1024, per_file
        expected = [r for _, records in shards[:FILES] for r in records]
        assert await src.read([0, len(expected) - 1]) == [expected[0], expected[-1]]
    finally:
        await src.aclose()


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Four ~1.2 MB files with small footers (part-0k), and four whose footers (~80 KB,
    20,000 one-byte records) are larger than the first read holds (part-1k)."""
    root = tmp_path_factory.mktemp("wide")
    small, big = [], []
    for k in range(4):
        path = root / f"part-0{k}.ar"
        write_theirs(path, make_records(1000, 1200, seed=k), "group_size:1,uncompressed")
        small.append(path)
        path = root / f"part-1{k}.ar"
        records = make_records(1, 20_000, seed=k)
        write_theirs(path, records, "group_size:1,uncompressed")
        big.append(path)
    return small, big, records


async def test_a_large_file_reads_its_footer_not_a_megabyte(gcs, wide):
    small, _, _ = wide
    for p in small:
        gcs.upload(p, f"wide/{p.name}")
    src, seen = await _open_counted(gcs, gcs.url("wide/part-*.ar"))
    try:
        assert seen["downloads"] == len(small)
        first = source_table.FIRST_SPAN + source_table.POSTSCRIPT_PROBE
        assert src.storage.stats.bytes == len(small) * first  # was 1 MiB a file
    finally:
        await src.aclose()


async def test_later_files_read_what_earlier_footers_took(gcs, wide):
    """One read in flight: the first file's footer is larger than the first read holds (a
    second read); the next files' first reads are sized to hold such a footer."""
    _, big, records = wide
    for p in big:
        gcs.upload(p, f"learn/{p.name}")
    storage = Storage(storage_options=gcs.storage_options, concurrency=1)
    before = gcs.proxy_stats
    src = await ArrayRecordSource.open(gcs.url("learn/part-*.ar"), storage=storage)
    try:
        assert _delta(before, gcs.proxy_stats)["downloads"] == len(big) + 1
        took = [ix.size - BLOCK_SIZE - ix.footer_offset for ix in src.file_indices]
        assert min(took) > source_table.FIRST_SPAN - BLOCK_SIZE  # so each needed more
        assert await src.read([len(src) - 1]) == [records[-1]]
    finally:
        await storage.aclose()


async def test_a_footer_larger_than_learned_costs_one_more_read(gcs, wide):
    small, big, records = wide
    for p in [*small[:3], big[3]]:
        gcs.upload(p, f"outlier/{p.name}")
    storage = Storage(storage_options=gcs.storage_options, concurrency=1)
    before = gcs.proxy_stats
    src = await ArrayRecordSource.open(gcs.url("outlier/part-*.ar"), storage=storage)
    try:
        assert _delta(before, gcs.proxy_stats)["downloads"] == 5  # 4 files, the last twice
        assert len(src) == 3 * 1200 + 20_000
        assert await src.read([len(src) - 1]) == [records[-1]]
    finally:
        await storage.aclose()


async def test_footer_beyond_the_tail_costs_a_second_request(gcs, shards, monkeypatch):
    # With no span before the postscript only the postscript block arrives with the first GET.
    monkeypatch.setattr(source_table, "FIRST_SPAN", 0)
    path, records = shards[-1]
    url = gcs.upload(path, "short-tail/big.ar")
    src, seen = await _open_counted(gcs, url)
    try:
        assert seen["requests"] == seen["downloads"] == 2
        assert await src.read([0, 2499]) == [records[0], records[2499]]
    finally:
        await src.aclose()


async def test_missing_named_object_is_one_request_and_a_clear_error(gcs):
    before = gcs.proxy_stats
    with pytest.raises(FileNotFoundError, match=r"gs://.*/nope\.ar: no such file or object"):
        await ArrayRecordSource.open(gcs.url("nope.ar"), storage_options=gcs.storage_options)
    assert _delta(before, gcs.proxy_stats)["requests"] == 1


async def test_empty_and_junk_objects_name_the_object(gcs):
    empty = gcs.upload_bytes(b"", "empty.ar")
    with pytest.raises(ArrayRecordFormatError, match=r"gs://.*empty\.ar.*too small"):
        await ArrayRecordSource.open(empty, storage_options=gcs.storage_options)
    junk = gcs.upload_bytes(b"\x01" * (3 << 16), "junk.ar")  # block-aligned, not ArrayRecord
    with pytest.raises(ArrayRecordFormatError, match=r"gs://.*junk\.ar.*postscript"):
        await ArrayRecordSource.open(junk, storage_options=gcs.storage_options)


async def test_rewritten_after_open_is_object_changed(gcs, shards):
    (path, records), (other, _) = shards[0], shards[1]
    url = gcs.upload(path, "rewritten.ar")
    src = await ArrayRecordSource.open(url, storage_options=gcs.storage_options, max_gap=0)
    try:
        assert await src.read([3]) == [records[3]]
        gcs.upload(other, "rewritten.ar")  # a new generation under the same name
        with pytest.raises(ObjectChangedError, match=r"rewritten\.ar.*re-open"):
            await asyncio.wait_for(src.read([7]), 10)
    finally:
        await src.aclose()


async def test_opening_gets_are_retried_and_counted(gcs, shards):
    urls = [gcs.upload(p, f"flaky/{p.name}") for p, _ in shards[:FILES]]
    storage = Storage(storage_options=gcs.storage_options, seed=0,
                      retry=RetryPolicy(base_delay=0.001, max_delay=0.01))
    before = gcs.proxy_stats
    gcs.set_faults(error_rate=0.3, statuses=(503, 429))
    try:
        src = await ArrayRecordSource.open(urls, storage=storage)
    finally:
        gcs.set_faults()
    seen = _delta(before, gcs.proxy_stats)
    try:
        assert len(src.urls) == FILES
        assert seen["faults"] > 0
        # every faulted GET was retried by our policy, visibly, and nothing else was sent
        assert storage.stats.retries == seen["faults"]
        assert storage.stats.requests == seen["requests"] == FILES + seen["faults"]
    finally:
        await storage.aclose()


# -- answers fake-gcs-server never gives ------------------------------------------------------
# Real GCS may answer a suffix range longer than the object with 200 and the whole body, and an
# empty object with 416; some GCS-compatible servers send no x-goog-generation. fake-gcs-server
# always answers 206 with the generation, so these run against a small real HTTP server that
# answers the download and metadata endpoints the way such a server would.


@contextlib.asynccontextmanager
async def _odd_server(objects: dict[str, bytes], mode: str):
    from aiohttp import web

    requests: list[str] = []

    async def download(request: web.Request) -> web.Response:
        requests.append("download")
        body = objects.get(request.match_info["name"])
        if body is None:
            return web.Response(status=404, text="Not Found")
        if mode == "416" and not body:
            return web.Response(status=416, text="The requested range cannot be satisfied.")
        headers = {} if mode == "no-generation" else {"x-goog-generation": "7"}
        rng = request.headers.get("Range", "")
        if mode == "200" or not rng:
            return web.Response(status=200, body=body, headers=headers)
        first, last = rng.removeprefix("bytes=").split("-")
        start, end = (len(body) - int(last), len(body)) if not first else (
            int(first), int(last) + 1)
        start = max(0, start)
        if mode == "head-not-tail":  # a server that reads "bytes=-N" as the first N bytes
            start, end = 0, min(len(body), int(last))
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(body)}"
        return web.Response(status=206, body=body[start:end], headers=headers)

    async def metadata(request: web.Request) -> web.Response:
        requests.append("metadata")
        name = request.match_info["name"]
        if name not in objects:
            return web.Response(status=404, text="Not Found")
        return web.json_response({"kind": "storage#object", "bucket": "b", "name": name,
                                  "size": str(len(objects[name])), "generation": "7"})

    app = web.Application()
    app.router.add_get("/download/storage/v1/b/b/o/{name}", download)
    app.router.add_get("/storage/v1/b/b/o/{name}", metadata)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield {"token": "anon", "endpoint_url": f"http://127.0.0.1:{port}"}, requests
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("mode", ["200", "416", "no-generation"])
async def test_whole_body_empty_object_and_missing_generation(shards, mode):
    path, records = shards[0]
    objects = {"small.ar": path.read_bytes(), "empty.ar": b""}
    async with _odd_server(objects, mode) as (opts, requests):
        storage = Storage(storage_options=opts)
        try:
            src = await ArrayRecordSource.open("gs://b/small.ar", storage=storage)
            # 200 with the whole body: one request opens it. Without a generation the
            # metadata is asked for (then the tail is read again): the pin is never skipped.
            assert requests == (["download", "metadata", "download"]
                                if mode == "no-generation" else ["download"])
            (info,) = src.table.files
            assert (info.size, info.version) == (len(objects["small.ar"]), "7")
            assert storage.stores.pins["gs://b/small.ar"] == "7"
            assert await src.read([0, len(records) - 1]) == [records[0], records[-1]]
            requests.clear()
            with pytest.raises(ArrayRecordFormatError, match=r"gs://b/empty\.ar.*too small"):
                await ArrayRecordSource.open("gs://b/empty.ar", storage=storage)
            # 416 (real GCS, empty object): one GET, then the size from the metadata
            assert requests == (["download", "metadata"] if mode != "200" else ["download"])
        finally:
            await storage.aclose()


async def test_gcs_alias_opens_as_gs(gcs, shards):
    path, records = shards[0]
    url = gcs.upload(path, "alias/a.ar")
    src = await ArrayRecordSource.open(url.replace("gs://", "gcs://"),
                                       storage_options=gcs.storage_options)
    try:
        assert src.urls == [url]  # not gs://gcs://...
        assert src.storage.stores.pins[url]
        assert await src.read([2]) == [records[2]]
    finally:
        await src.aclose()


async def test_a_206_that_is_not_the_tail_is_a_clear_error(shards):
    path, _ = shards[-1]  # bigger than the 1 MiB asked for
    async with _odd_server({"big.ar": path.read_bytes()}, "head-not-tail") as (opts, _):
        storage = Storage(storage_options=opts)
        try:
            n = BLOCK_SIZE + source_table.FIRST_SPAN
            with pytest.raises(StorageError, match=rf"gs://b/big\.ar: asked for the last "
                                                   rf"{n} bytes.*Content-Range 'bytes 0-"):
                await ArrayRecordSource.open("gs://b/big.ar", storage=storage)
        finally:
            await storage.aclose()
