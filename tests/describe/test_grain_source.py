"""`ArrayRecordSource` as a Grain data source (issue 16 item 6): it pickles once opened (a
copy reopens lazily), has `__getitems__`, and Grain's own multiprocess prefetch reads every
record through it."""

from __future__ import annotations

import pickle

import grain
import pytest
from absl import flags

import aioloader as al

from ..runtime.test_pipeline import _write


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("grainsrc"), n=200)


def test_an_opened_source_pickles_and_the_copy_reads_the_same(data):
    with al.ArrayRecordSource(data) as src:
        first = src[[0, 199, 5]]  # opened: a loop, a table, open files
        copy = pickle.loads(pickle.dumps(src))
        with copy:
            assert len(copy) == 200
            assert copy.__getitems__([0, 199, 5]) == first


@pytest.mark.allow_leaks  # Grain's own pool threads outlive its iterator
def test_grain_mp_prefetch_reads_every_record(data):
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # mp_prefetch reads absl flags (a script's app.run)
    with al.ArrayRecordSource(data) as src:
        want = sorted(src[list(range(len(src)))])
        ds = (grain.MapDataset.source(src).to_iter_dataset()
              .mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
        got = sorted(bytes(r) for r in ds)
    assert got == want
