"""`Dataset.from_source` (issue 16 item 6): any object with `__len__`/`__getitem__` — a list
of records, a Grain data source, ours — read by index where records are decoded."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import grain
import pytest

import aioloader as al

from ..runtime.test_pipeline import _write

N = 90


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("objects"), n=N)


def records():
    return [json.dumps({"id": i}).encode() for i in range(N)]


def parse(record):
    return json.loads(record)["id"]


def noisy(i, rng):
    return (i, int(rng.integers(0, 1 << 30)))


class Counted:
    """A source with Grain's batched read (`__getitems__`), counting its calls."""

    def __init__(self, items):
        self.items, self.batched, self.single = items, 0, 0

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        self.single += 1
        return self.items[i]

    def __getitems__(self, indices):
        self.batched += 1
        return [self.items[i] for i in indices]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_list_of_records_is_a_source_and_ds_i_is_the_loaders_element(workers):
    ds = (al.Dataset.from_source(records()).shuffle(4).repeat(2).shard(1, 2).map(parse)
          .random_map(noisy))
    got = list(ds.loader(workers=workers))
    assert len(ds) == len(got) == N
    assert ds[list(range(len(ds)))] == got and ds[-1] == got[-1]


def test_filter_pack_and_batch_work_over_an_object_source():
    ds = (al.Dataset.from_source(records()).map(json.loads).filter(lambda e: e["id"] % 3 == 0)
          .batch(4))
    ids = [int(i) for b in ds.loader(workers=2) for i in b["id"]]
    assert ids == list(range(0, N, 3))


def test_a_grain_source_reads_what_the_files_hold(data):
    src = grain.sources.ArrayRecordDataSource(data)
    ours = al.Dataset.from_arrayrecord(data).shuffle(9).map(parse)
    theirs = al.Dataset.from_source(src).shuffle(9).map(parse)
    want = list(ours.loader(workers=0))
    assert list(theirs.loader(workers=2)) == want
    assert theirs[[0, 5]] == [want[0], want[5]]


def test_datasets_of_the_same_object_are_equal():
    rows = records()
    assert al.Dataset.from_source(rows).map(parse) == al.Dataset.from_source(rows).map(parse)
    assert al.Dataset.from_source(rows) != al.Dataset.from_source(records())


def test_our_own_source_reads_as_from_arrayrecord(data):
    src = al.ArrayRecordSource(data)
    assert al.Dataset.from_source(src) == al.Dataset.from_arrayrecord(data)


def test_getitems_is_used_when_the_source_has_it():
    src = Counted(records())
    ds = al.Dataset.from_source(src).map(parse).batch(30)
    assert [b.tolist() for b in ds.loader(workers=0)] == [list(range(k, k + 30))
                                                        for k in range(0, N, 30)]
    assert src.batched >= 1 and src.single == 0


def test_resume_from_a_state_is_exact():
    ds = al.Dataset.from_source(records()).shuffle(1).map(parse).batch(8)
    with ds.loader(workers=0) as it:
        batches = iter(it)
        for _ in range(3):
            next(batches)
        state = it.get_state()
        rest = [b.tolist() for b in batches]
    with ds.loader(workers=1, state=state) as again:
        assert [b.tolist() for b in again] == rest
        assert "source(<list>)" in str(again.stats())
    assert "source(<list>)" in state["pipeline"][0]


@pytest.mark.parametrize(("obj", "says"), [
    ("train.array_record", r"not a str: for ArrayRecord files by path, use "
                           r"Dataset.from_arrayrecord"),
    (iter([b"x"]), r"needs an object with __len__ and __getitem__.*has no __len__"),
    (42, r"has no __len__ or __getitem__"),
])
def test_what_is_not_a_source_is_refused(obj, says):
    with pytest.raises(TypeError, match=says):
        al.Dataset.from_source(obj)


class Gappy:
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 13:
            raise KeyError("row 13 is missing")
        return i


@pytest.mark.parametrize("workers", [0, 1])
def test_what_the_source_raises_names_the_source_and_record(workers):
    ds = al.Dataset.from_source(Gappy()).batch(4)
    with pytest.raises(al.TransformError, match=r"the source <Gappy> raised KeyError: 'row 13 "
                                                r"is missing' reading record 13"):
        list(ds.loader(workers=workers))
    with pytest.raises(al.TransformError, match="reading record 13"):
        al.Dataset.from_source(Gappy())[13]


def test_a_block_shuffle_of_an_object_source_is_refused_when_built():
    with pytest.raises(ValueError, match=r"from_source\(\) dataset has none: use shuffle"):
        al.Dataset.from_source(records()).shuffle(1, strategy="block")


def test_a_source_that_cannot_travel_is_refused_at_start_by_name():
    class Locked(Counted):
        def __init__(self, items):
            super().__init__(items)
            self.lock = threading.Lock()

    ds = al.Dataset.from_source(Locked(records())).map(parse)
    with pytest.raises(TypeError, match=r"the source <.*Locked> cannot be pickled.*lock.*"
                                        r"workers=0 or executor=\"threads\""):
        ds.loader(workers=1)
    assert list(ds.loader(workers=0)) == list(range(N))
    # threads of this process read the one object (it must bear calls from several at once)
    assert list(ds.loader(workers=2, executor="threads")) == list(range(N))


NOTEBOOK = """
import json, aioloader as al
class Rows:  # a source class defined in __main__, as in a notebook cell
    def __len__(self):
        return 50
    def __getitem__(self, i):
        return json.dumps({"id": i}).encode()
ds = al.Dataset.from_source(Rows()).shuffle(3).map(lambda r: json.loads(r)["id"] * 2)
got = list(ds.loader(workers=2))
assert got == list(ds.loader(workers=0)) == [ds[i] for i in range(len(ds))]
assert sorted(got) == list(range(0, 100, 2)), got
print("ok", len(got))
"""


def test_a_notebook_source_class_works_with_workers():
    out = subprocess.run([sys.executable, "-c", NOTEBOOK], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok 50")
