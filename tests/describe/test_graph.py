"""`ds.graph()` (issue 16 item 7): every stage with the spec of the element after it."""

from __future__ import annotations

import json

import numpy as np

import aioloader as al
from aioloader.runtime.graph import spec

from ..runtime.test_pipeline import _write


def tokens(e):
    return {"id": np.int64(e["id"]), "tokens": np.asarray(e["tokens"][:4] + [0] * 4, np.int32)[:4]}


def test_each_stage_shows_its_first_element(tmp_path):
    ds = (al.Dataset.from_arrayrecord(_write(tmp_path, n=60)).shuffle(2).map(json.loads)
          .map(tokens).filter(lambda e: e["id"] >= 0).batch(8))
    lines = ds.graph().splitlines()
    assert len(lines) == len(ds.describe()) == 6
    assert lines[0].startswith("source(") and "bytes[" in lines[0]
    assert "shuffle(seed=2): (chooses positions" in lines[1]
    assert "map(loads): {'id': int, 'tokens': list[" in lines[2]
    assert lines[3].endswith("map(tokens): {'id': int64, 'tokens': int32[4]}")
    assert lines[5].endswith("batch(8): {'id': int64[8], 'tokens': int32[8, 4]}")


def test_spec_names_types_shapes_and_dtypes():
    assert spec(np.zeros((2, 3), np.float16)) == "float16[2, 3]"
    assert spec(b"abc") == "bytes[3]"
    assert spec((1, "ab", np.int8(3))) == "tuple[3](int, str[2], int8)"
    assert spec(list(range(6))) == "list[6](int, int, int, int, ...)"
