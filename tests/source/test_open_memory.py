"""Opening a file of many small records builds what the index keeps and little else.

A group_size 1 file's footer is ~10 bytes per record and its index keeps 12 (chunk offsets
and the footer offset as int64, decoded sizes as uint32, record counts a broadcast of 1).
Opening streams a footer this large (`arrayrecord.footerstream`): it is to allocate nothing
per record beyond the kept columns — not the footer, nor its header-stripped copy, nor int64
columns narrowed or dropped afterwards, nor a copy of the offsets into the record table —
and little else: a window or two of the footer.
"""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest

import aioloader.arrayrecord.footer as footer
from aioloader.arrayrecord import read_index
from aioloader.arrayrecord.layout import BLOCK_SIZE
from aioloader.io.storage import Storage
from aioloader.source.opening import open_table

from ..support.arrayrecord_util import write_theirs

RECORDS = 200_000
SLACK = 1 << 20  # a read window and its stripped copy, the metadata, small objects

pytestmark = pytest.mark.skipif(getattr(footer._native, "lean_columns", None) is None,
                                reason="_footer not built")


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    path = tmp_path_factory.mktemp("many") / "many.ar"
    write_theirs(path, [k.to_bytes(8, "little") for k in range(RECORDS)],
                 "group_size:1,uncompressed")
    return path


def _kept(arrays) -> int:
    """Bytes the arrays own (a view or a broadcast owns none)."""
    return sum(a.nbytes for a in arrays if a.base is None and a.strides != (0,))


def _footer_bytes(path, index) -> int:
    return os.path.getsize(path) - BLOCK_SIZE - index.footer_offset


def test_the_index_of_many_records_is_built_in_place(many):
    size = os.path.getsize(many)
    with open(many, "rb") as f:
        def fetch(offset, length):
            return os.pread(f.fileno(), length, offset)

        read_index(size, fetch, small_reads=True)  # warm: imports, caches
        tracemalloc.start()
        try:
            ix = read_index(size, fetch, small_reads=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert ix.num_records == RECORDS and ix.one_record_chunks
    kept = 12 * RECORDS + 8  # offsets and the footer offset (int64), decoded sizes (uint32)
    assert _footer_bytes(many, ix) > SLACK  # (else holding it whole would pass)
    assert peak <= kept + SLACK, (peak, kept)
    assert ix.chunk_decoded_sizes.dtype == np.uint32
    assert ix.bounds is not None and ix.bounds[-1] == ix.footer_offset
    assert _kept([ix.bounds, ix.chunk_decoded_sizes, ix.chunk_records]) == kept


async def test_the_record_table_of_one_file_keeps_its_footers_offsets(many):
    storage = Storage()
    try:
        table = await open_table([str(many)], storage, verify="headers", index_cache=None)
        ix = table.indices[0]
        assert table._chunks.bounds is ix.bounds  # shared, not copied
        assert np.shares_memory(ix.chunk_ends, ix.chunk_offsets)
        assert len(table) == RECORDS
        files, chunk, within = table.locate([0, RECORDS - 1])
        assert files.tolist() == [0, 0] and chunk.tolist() == [0, RECORDS - 1]
        assert within.tolist() == [0, 0]
    finally:
        await storage.aclose()
