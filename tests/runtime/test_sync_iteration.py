"""A plain `for` over a loader: leaving it closes the loader, and a second iteration says so
instead of ending at once as if the data had run out."""

from __future__ import annotations

import pytest

import aioloader as al


@pytest.fixture
def ds(tmp_path):
    path = str(tmp_path / "a.array_record")
    with al.ArrayRecordWriter(path) as w:
        for i in range(20):
            w.write(b"%d" % i)
    return al.Dataset.from_arrayrecord(path).batch(2)


def test_one_iterator_taken_a_batch_at_a_time_gives_every_batch(ds):
    with ds.loader() as it:
        batches = iter(it)
        got = [next(batches) for _ in range(3)] + list(batches)
    assert [int(x) for b in got for x in b] == list(range(20))


def test_iterating_again_after_leaving_a_for_loop_is_an_error_not_an_empty_loop(ds):
    with ds.loader() as it:
        for _ in it:
            break
        with pytest.raises(RuntimeError, match=r"left.*keep one iterator.*state="):
            next(iter(it))
        assert it.get_state() is not None  # what was handed out can still be saved


def test_the_same_after_a_dropped_iterator(ds):
    with ds.loader() as it:
        first = next(iter(it))
        assert [int(x) for x in first] == [0, 1]
        with pytest.raises(RuntimeError, match="left"):
            for _ in it:
                pass


def test_a_loader_iterated_to_its_end_just_ends_again(ds):
    with ds.loader() as it:
        assert len(list(it)) == 10
        assert list(it) == []
