"""A wrong argument to a `Dataset` verb is refused at the call, naming the argument (as the
op that checks it spells it: `Shuffle seed`, `batch size`), never converted (`int("8")`,
`int(1.5)`) or failing later; empty and endless repeats as Grain."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import aioloader as al

SEED_LIMIT = 1 << 64  # seeds are 64-bit keys

DS = al.Dataset.from_source(list(range(10)))
AR = al.Dataset.from_arrayrecord("never-opened.array_record")  # describing opens nothing


@pytest.mark.parametrize("call, error, what", [
    (lambda: DS.shuffle(seed="a"), TypeError, r"Shuffle seed must be an integer, got 'a' \(str\)"),
    (lambda: DS.shuffle(seed=None), TypeError, r"Shuffle seed must be an integer, got None"),
    (lambda: DS.shuffle(seed=1.5), TypeError, r"Shuffle seed .* got 1\.5"),
    (lambda: DS.shuffle(seed=True), TypeError, r"Shuffle seed .* got True"),
    (lambda: DS.shuffle(seed=-1), ValueError,
     r"Shuffle seed must be in \[0, 18446744073709551616\), got -1"),
    (lambda: DS.shuffle(seed=SEED_LIMIT), ValueError, r"seeds are 64-bit keys"),
    (lambda: DS.shuffle(1, strategy="blocks"), ValueError, r"strategy must be"),
    (lambda: AR.block_shuffle(1, block_bytes="4M"), TypeError,
     r"block_bytes must be an integer or None, got '4M'"),
    (lambda: AR.block_shuffle(1, window_bytes=0), ValueError,
     r"window_bytes must be >= 1 or None, got 0"),
    (lambda: DS.batch("8"), TypeError, r"batch size must be an integer, got '8'"),
    (lambda: DS.batch(8.0), TypeError, r"batch size must be an integer, got 8\.0"),
    (lambda: DS.batch(0), ValueError, r"batch size must be >= 1, got 0"),
    (lambda: DS.batch(8, drop_remainder="no"), TypeError,
     r"batch drop_remainder must be True or False, got 'no'"),
    (lambda: DS.repeat("3"), TypeError, r"Repeat num_epochs must be an integer or None, got '3'"),
    (lambda: DS.repeat(0), ValueError, r"Repeat num_epochs must be >= 1 or None, got 0"),
    (lambda: DS.shard("0", 2), TypeError, r"Shard index must be an integer, got '0'"),
    (lambda: DS.shard(2, 2), ValueError, r"Shard index must be in \[0, 2\), got 2"),
    (lambda: DS.shard(0, 0), ValueError, r"Shard count must be >= 1, got 0"),
    (lambda: DS.shard(0, 2, contiguous=1), TypeError,
     r"Shard contiguous must be True or False, got 1"),
    (lambda: DS.shard_by_jax_process(drop_remainder=None), TypeError,
     r"shard_by_jax_process drop_remainder must be True or False"),
    (lambda: DS.random_map(lambda x, rng: x, seed="1"), TypeError,
     r"random_map seed must be an integer, got '1'"),
    (lambda: DS.random_map(lambda x, rng: x, seed=-5), ValueError,
     r"random_map seed must be in \[0, "),
    (lambda: al.Dataset.mix([DS, DS], seed=2.5), TypeError,
     r"mix seed must be an integer or None, got 2\.5"),
    (lambda: al.Dataset.mix([DS, DS], seed=-1), ValueError, r"mix seed must be in \[0, "),
    (lambda: al.Dataset.mix([DS, DS], weights="ab"), TypeError, r"mix\(\) weights must be"),
    (lambda: al.Dataset.mix([DS, DS], weights=[1, None]), TypeError, r"weights must be num"),
    (lambda: al.Dataset.mix(DS), TypeError, r"mix\(\) takes a list of datasets, got one"),
    (lambda: al.Dataset.concatenate(DS), TypeError, r"concatenate\(\) takes a list"),
    (lambda: DS.pack({"x": 4}, num_packing_bins="2"), TypeError,
     r"num_packing_bins must be an int, got '2'"),
    (lambda: DS.pack([("x", 4)], num_packing_bins=2), TypeError,
     r"length_struct must map feature names to lengths, got list"),
    (lambda: DS[True], TypeError, r"index a Dataset with an int"),
    (lambda: al.Dataset.from_arrayrecord(5), TypeError, r"from_arrayrecord\(\) paths must be"),
    (lambda: al.Dataset.from_arrayrecord([]), TypeError, r"a non-empty list of them"),
    (lambda: al.Dataset.from_arrayrecord(["a.ar", None]), TypeError, r"paths must be"),
    (lambda: al.Dataset.from_arrayrecord("a.ar", storage_options="token=x"), TypeError,
     r"from_arrayrecord\(\) storage_options must be a dict, got str"),
    (lambda: al.Dataset.from_arrayrecord("a.ar", verify="full"), ValueError,
     r"from_arrayrecord\(\) verify must be one of \('none', 'headers', 'all'\)"),
])
def test_a_wrong_argument_is_refused_at_the_call_by_name(call, error, what):
    with pytest.raises(error, match=what):
        call()


def test_good_arguments_still_work():
    assert DS.shuffle(np.uint64(SEED_LIMIT - 1)).index_ops[0].seed == SEED_LIMIT - 1
    assert AR.block_shuffle(0, block_bytes=4e6).index_ops[0].block_bytes == 4_000_000
    assert DS.batch(np.int32(4), drop_remainder=np.bool_(True)).batching.size == 4
    assert sorted(DS.shuffle(0)) == list(range(10))


def test_an_empty_dataset_repeated_is_empty_as_in_grain():
    empty = al.Dataset.from_source([])
    for ds in (empty.repeat(3), empty.repeat(), empty.shuffle(1).repeat(2).batch(2)):
        assert list(ds) == []
    assert len(empty.repeat(3)) == 0 and len(empty.repeat()) == 0
    gc.collect()  # the datasets' random access closes here, on this thread


def test_an_endless_dataset_cannot_be_repeated_as_in_grain():
    with pytest.raises(ValueError, match=r"repeat\(\) of an endless dataset"):
        DS.repeat().repeat()
    with pytest.raises(ValueError, match="endless"):
        DS.repeat().shard(0, 2).repeat(3)
    with pytest.raises(ValueError, match="endless"):
        al.Dataset.mix([DS.repeat(), DS.repeat()]).repeat()
    # finite again: a repeat after a slice of it, or after a mix with a finite input
    assert list(DS.repeat()[:3].repeat(2)) == [0, 1, 2] * 2
    assert len(list(al.Dataset.mix([DS.repeat(), DS]).repeat(2))) > 0
    assert list(DS.repeat(2).repeat(2)) == list(range(10)) * 4


def test_indexing_past_the_end_says_how_to_wrap():
    ds = DS.shuffle(42)
    with pytest.raises(IndexError, match=r"position 10 is out of range.*ds\.repeat\(\)\[i\]"):
        ds[10]
    with pytest.raises(IndexError, match="position 5 is out of range"):
        DS[:5][5]
    assert ds.repeat()[10] in range(10)
    del ds
    gc.collect()


def test_integers_of_any_kind_and_iterables_of_paths_are_taken(tmp_path):
    """What worked before the checks still works: 0-d integer arrays (and any type with
    `__index__`, as jax's scalars have) as seeds and sizes, and any ordered iterable of
    paths (`Path.glob`, a numpy array of names); a set of paths is refused (its order
    differs between processes)."""
    ds = al.Dataset.from_source(list(range(10)))
    assert ds.shuffle(np.array(5)).batch(np.array(2)).index_ops == \
        ds.shuffle(5).batch(2).index_ops
    assert ds.batch(np.uint64(3)).batching == ds.batch(3).batching
    with pytest.raises(TypeError, match="seed"):
        ds.shuffle(np.array(True))
    with pytest.raises(TypeError, match="seed"):
        ds.shuffle(np.array(1.5))
    for name in ("a.array_record", "b.array_record"):
        (tmp_path / name).write_bytes(b"")
    want = tuple(sorted(str(p) for p in tmp_path.glob("*.array_record")))
    got = al.Dataset.from_arrayrecord(sorted(tmp_path.glob("*.array_record"))).source.paths
    assert got == want
    assert al.Dataset.from_arrayrecord(p for p in want).source.paths == want
    assert al.Dataset.from_arrayrecord(np.array(want)).source.paths == want
    with pytest.raises(TypeError, match="order"):
        al.Dataset.from_arrayrecord(set(want))
