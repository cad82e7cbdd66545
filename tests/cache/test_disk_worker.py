"""A worker's kept disk tier entries (aioloader.workers.localfiles): maps are kept across
tasks, bounded, and never read under an identity the parent did not prove, unless the
worker checked the file itself: an entry another process dropped and re-wrote never
returns wrong bytes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

import aioloader as al
from aioloader.cache.disk import PAYLOAD_AT, DiskCache
from aioloader.cache.tier import DiskTier
from aioloader.errors import ObjectChangedError
from aioloader.testing import local_gcs
from aioloader.workers import localfiles
from aioloader.workers.decode import Decoder

from ..runtime.test_pipeline import _write
from ..support.arrayrecord_util import read_theirs

SEGMENT = 8 << 10


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    data = _write(tmp_path_factory.mktemp("dw"), n=600, shards=2)
    with local_gcs() as gcs:
        urls = [gcs.upload(p, f"w/{os.path.basename(p)}") for p in data]
        yield gcs, urls, [r for p in data for r in read_theirs(p)]


def _refs(gcs, urls, cache_dir, order):
    """The disk tier's refs of records `order` (the cache filled first), and the tier's
    segment keys."""
    with al.ArrayRecordSource(urls, storage_options=gcs.storage_options) as src:
        table = src.table  # opened here, not on the source's own loop

        async def go():
            tier = DiskTier(DiskCache(cache_dir, 1 << 30), table, src.storage, SEGMENT)
            tier.start_filler(4, now=True)
            while not tier.filled:
                await asyncio.sleep(0.01)
            refs = await tier.local_refs(table.chunk_refs(order))
            await tier.aclose()
            return refs, tier.keys

        return src._sync(go())


def _replace(path, data: bytes) -> None:
    """Another process's re-write: a new file renamed over the name."""
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def test_a_kept_entry_dropped_and_rewritten_elsewhere_never_gives_wrong_bytes(dataset,
                                                                            tmp_path):
    gcs, urls, theirs = dataset
    order = np.random.default_rng(1).permutation(len(theirs))
    want = [theirs[i] for i in order.tolist()]
    refs, _ = _refs(gcs, urls, tmp_path / "c", order)
    assert refs is not None and refs.idents is not None and len(refs.paths) > 4
    decoder = Decoder()
    try:
        assert decoder.records(refs, None) == want
        opened = decoder.files.entries_opened
        assert decoder.records(refs, None) == want  # kept across tasks: none opened again
        assert decoder.files.entries_opened == opened
        # Another process drops an entry and writes a damaged one in its place: the worker
        # keeps the file the parent proved, and reads the right bytes from it.
        path = refs.paths[0]
        good = Path(path).read_bytes()
        bad = bytearray(good)
        bad[PAYLOAD_AT + 10] ^= 0xFF
        _replace(path, bytes(bad))
        assert decoder.records(refs, None) == want
        # A new decoder (or one whose map was dropped) meets the damaged file under an
        # identity the parent did not prove: it checks it, and refuses it.
        fresh = Decoder()
        try:
            with pytest.raises(ObjectChangedError, match="replaced while in use"):
                fresh.records(refs, None)
            # A good re-write (the same segment's entry, a new file) passes the check.
            _replace(path, good)
            assert fresh.records(refs, None) == want
        finally:
            fresh.close()
        # The parent proving the new file: the kept map of the old one is not used.
        refs2, _ = _refs(gcs, urls, tmp_path / "c", order)
        assert refs2.idents[0] != refs.idents[0]
        before = decoder.files.entries_opened
        assert decoder.records(refs2, None) == want
        assert decoder.files.entries_opened == before + 1
    finally:
        decoder.close()


def test_entries_of_another_segment_are_refused(dataset, tmp_path):
    gcs, urls, theirs = dataset
    order = np.arange(len(theirs))
    refs, _ = _refs(gcs, urls, tmp_path / "c", order)
    a, b = refs.paths[0], refs.paths[1]
    _replace(a, Path(b).read_bytes())  # a valid entry, of the wrong segment
    decoder = Decoder()
    try:
        with pytest.raises(ObjectChangedError, match="another segment"):
            decoder.records(refs, None)
    finally:
        decoder.close()


def test_open_entries_are_bounded(dataset, tmp_path, monkeypatch):
    gcs, urls, theirs = dataset
    monkeypatch.setattr(localfiles, "MAX_OPEN_ENTRIES", 3)
    order = np.random.default_rng(2).permutation(len(theirs))
    refs, _ = _refs(gcs, urls, tmp_path / "c", order)
    assert len(refs.paths) > 3
    decoder = Decoder()
    try:
        for lo in range(0, len(order), 50):  # tasks of 50 records
            part = refs.take(lo, lo + 50)
            got = decoder.records(part, None)
            assert got == [theirs[i] for i in order[lo : lo + 50].tolist()]
            assert len(decoder.files._entries) <= 3
    finally:
        decoder.close()
