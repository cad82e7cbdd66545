"""Workers read local records themselves: the records must be exactly the format layer's,
for every codec, record size (within a block or across block boundaries) and verify level."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

import aioloader as al
from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.arrayrecord.layout import BLOCK_SIZE

from ..support.arrayrecord_util import make_records, write_theirs


def _records(sizes, seed):
    rng = random.Random(seed)
    return [make_records(rng.choice(sizes), 1, seed=seed * 1000 + i)[0] for i in range(60)]


@pytest.mark.parametrize("codec", ["zstd:3", "uncompressed", "snappy", "brotli:1"])
def test_records_read_by_workers_equal_the_format_layers(tmp_path, codec):
    records = _records([0, 7, 1024, 70_000, 200_000], seed=len(codec))
    path = tmp_path / "mixed.ar"
    write_theirs(path, records, f"group_size:1,{codec}")
    for verify in ("none", "headers", "all"):
        ds = al.Dataset.from_arrayrecord(str(path), verify=verify).map(len).batch(7)
        ds_bytes = al.Dataset.from_arrayrecord(str(path), verify=verify).batch(7)
        for workers in (0, 1):
            lens = np.concatenate(list(ds.loader(workers=workers)))
            assert lens.tolist() == [len(r) for r in records]
        got = [r for b in ds_bytes.loader(workers=1) for r in b]
        assert got == records, verify


def test_a_damaged_block_header_read_by_a_worker_names_the_file(tmp_path):
    records = [bytes([i]) * 100_000 for i in range(4)]  # every record crosses a boundary
    path = tmp_path / "damaged.ar"
    write_theirs(path, records, "group_size:1,uncompressed")
    with open(path, "r+b") as f:  # flip a bit in the block header at 64 KiB
        f.seek(BLOCK_SIZE + 3)
        b = f.read(1)
        f.seek(BLOCK_SIZE + 3)
        f.write(bytes([b[0] ^ 1]))
    ds = al.Dataset.from_arrayrecord(str(path)).batch(2)
    with pytest.raises(ArrayRecordFormatError, match=r"damaged\.ar.*block header hash"):
        list(ds.loader(workers=1))
    assert os.path.getsize(path) > 2 * BLOCK_SIZE
