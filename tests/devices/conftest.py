"""What the device tests share: a small two-shard dataset of JSON records."""

from __future__ import annotations

import pytest

from ..runtime.test_pipeline import _write


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("jaxdata"), n=100, shards=2)
