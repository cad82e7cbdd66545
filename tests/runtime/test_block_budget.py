"""A loader's block shuffle sized from its budgets: the sizes chosen are in `stats()` and the
state, a state keeps the sizes it was saved with, and a remote dataset larger than
`resident_bytes` is read in blocks with the default sizes — or, with sizes the memory tier
cannot hold, refused with both settings named (counted at the emulator)."""

from __future__ import annotations

import os

import pytest

import aioloader as al
from aioloader.testing import local_gcs

from ..runtime.test_pipeline import _write
from ..support import pipeline_fns as fns

N = 3000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("bb"), n=N, shards=4)


def _ds(paths, **kw):
    return (al.Dataset.from_arrayrecord(paths, **kw).shuffle(5, strategy="block")
            .map(fns.decode).map(fns.just_id).batch(50))


def _size(files) -> int:
    return sum(os.path.getsize(p) for p in files)


def test_the_sizes_chosen_are_in_the_stats_and_the_state(files):
    resident = _size(files) // 4
    with _ds(files).loader(resident_bytes=resident) as it:
        next(iter(it))
        line = next(ln for ln in it.stats().graph if ln.startswith("shuffle("))
        state = it.get_state()
    window = resident // 2
    assert line == (f"shuffle(seed=5, block, block_bytes={window // 4}, "
                     f"window_bytes={window})")
    assert line in state["pipeline"]


def test_a_state_keeps_the_sizes_it_was_saved_with(files):
    """A state saved under the default budgets (4 MiB / 64 MiB) resumes with a small
    resident_bytes as the stream it was saved in."""
    batches, states = [], []
    with _ds(files).loader() as it:
        for b in it:
            batches.append(b.tolist())
            states.append(it.get_state())
    state = states[4]
    assert "block_bytes=4194304, window_bytes=67108864" in " ".join(state["pipeline"])
    with _ds(files).loader(resident_bytes=_size(files) // 4, state=state) as it:
        assert [b.tolist() for b in it] == batches[5:]
        assert "block_bytes=4194304, window_bytes=67108864" in " ".join(it.stats().graph)


@pytest.fixture(scope="module")
def bucket(files):
    with local_gcs(proxy=True) as gcs:
        yield gcs, [gcs.upload(p, f"bb/{os.path.basename(p)}") for p in files]


def test_a_remote_dataset_larger_than_the_tier_is_read_in_blocks_by_default(files, bucket):
    gcs, urls = bucket
    want = sorted(i for b in _ds(files).loader(resident_bytes=1) for i in b.tolist())
    n0 = gcs.proxy_stats.downloads
    remote = _ds(urls, storage_options=gcs.storage_options)
    got = [i for b in remote.loader(resident_bytes=_size(files) // 4) for i in b.tolist()]
    assert sorted(got) == want == list(range(N))
    # segments, not a GET per record (under load the readahead may lag behind a few tasks,
    # whose records then come by the bucket's merged reads: a third is far from N)
    assert gcs.proxy_stats.downloads - n0 < N // 3


def test_sizes_the_tier_cannot_hold_are_refused_naming_both_settings(bucket):
    gcs, urls = bucket
    resident = 64 << 10
    ds = (al.Dataset.from_arrayrecord(urls, storage_options=gcs.storage_options)
          .shuffle(5, strategy="block", block_bytes=16 << 10, window_bytes=128 << 10))
    with pytest.raises(ValueError, match="needs resident_bytes >= 131072") as e:
        next(iter(ds.loader(resident_bytes=resident)))
    assert "window_bytes=131072" in str(e.value) and "resident_bytes=65536" in str(e.value)
