"""Big batches made piece by piece straight into their slot (`aioloader.workers.stacking`):
the same batch as collating it whole, or None (made whole) — a pure property over elements
and cuts — and, end to end, the same batches with workers as without, in less memory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.elements.collate import CollateError, collate
from aioloader.workers import stacking
from aioloader.workers.arena import SlotAlloc

from ..support import pipeline_fns as fns
from ..support.arrayrecord_util import write_noise


def _elements(draw, n: int) -> tuple[list, bool]:
    """`n` elements of one drawn structure: dicts of arrays, numbers and strings; some
    draws make one element differ (a shape, a dtype, a key) so pieces may not stack."""
    width = draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["array", "dict", "tuple", "numbers", "strings"]))
    odd = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    how = draw(st.sampled_from(["shape", "dtype", "key", "float"]))
    out = []
    for k in range(n):
        a = np.arange(k, k + width, dtype=np.int32)
        if k == odd and how == "shape":
            a = np.arange(width + 1, dtype=np.int32)
        if k == odd and how == "dtype":
            a = a.astype(np.float64)
        num: object = float(k) + 0.5 if (k == odd and how == "float") else k
        if kind == "array":
            out.append(a)
        elif kind == "tuple":
            out.append((a, num))
        elif kind == "numbers":
            out.append(num)
        elif kind == "strings":
            out.append({"text": f"t{k}", "x": a})
        else:
            d = {"x": a, "y": num}
            if k == odd and how == "key":
                d = {"y": num, "x": a}  # same keys, other order: the batch keeps the first's
            out.append(d)
    return out, odd is None


@st.composite
def batches(draw):
    n = draw(st.integers(1, 24))
    elements, uniform = _elements(draw, n)
    bounds = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=6)) if n > 1 else []))
    pieces = list(zip([0, *bounds], [*bounds, n]))
    return elements, pieces, uniform


def _whole(elements):
    try:
        return collate(elements)
    except CollateError:
        return None


def _leaves(tree, out):
    if isinstance(tree, dict):
        out.append(("d", tuple(tree)))
        for v in tree.values():
            _leaves(v, out)
    elif isinstance(tree, tuple):
        out.append(("t", len(tree)))
        for v in tree:
            _leaves(v, out)
    elif isinstance(tree, list):
        out.append(("l", tuple(tree)))
    else:
        out.append((tree.dtype.str, tree.shape, tree.tobytes()))
    return out


@settings(max_examples=300, deadline=None)
@given(batches())
def test_pieces_make_the_batch_collate_makes_or_give_way(case):
    elements, pieces, uniform = case
    buf = bytearray(1 << 20)
    try:
        got = stacking.make_batch(0, len(elements), pieces, lambda a, b: elements[a:b],
                                  SlotAlloc(buf, 0, len(buf)))
    except CollateError:  # (the worker then makes it whole, which says where)
        got = None
    want = _whole(elements)
    if uniform:  # elements alike: pieces must stack
        assert got is not None
    if got is None:  # made whole instead: allowed, and a must when collate differs
        return
    assert want is not None, "pieces made a batch that collate refuses"
    assert _leaves(got, []) == _leaves(want, [])


@given(st.lists(st.integers(1, 5 << 20), min_size=1, max_size=200), st.data())
def test_cuts_cover_the_rows_in_order(sizes, data):
    sizes = np.asarray(sizes, dtype=np.int64)
    lo = data.draw(st.integers(0, len(sizes) - 1))
    hi = data.draw(st.integers(lo + 1, len(sizes)))
    got = stacking.cuts(sizes, lo, hi, target=8 << 20)
    assert got[0][0] == lo and got[-1][1] == hi
    assert all(a < b for a, b in got) and all(x[1] == y[0] for x, y in itertools.pairwise(got))
    for a, b in got[:-1]:  # each closes at the row that brings it to the target
        assert sizes[a:b].sum() >= 8 << 20 and (b - a == 1 or sizes[a : b - 1].sum() < 8 << 20)


RECORD = 1 << 20  # 40 records of 1 MiB, batches of 40: 40 MiB, over MIN_TASK_BYTES


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return write_noise(tmp_path_factory.mktemp("stacking") / "mib.array_record", 80, RECORD)


def test_big_batches_made_in_pieces_equal_the_whole_ones(big, monkeypatch):
    """Made in pieces in workers (workers=2) and in this process (workers=0 with slots
    that hold a batch: without, a big batch is made whole in fresh memory); with pieces
    turned off (a threshold no task reaches) the batches are the same."""
    ds = al.Dataset.from_arrayrecord(big).shuffle(5).repeat(2).map(fns.as_uint8).batch(40)
    with ds.loader(workers=2) as it:
        got = [np.array(b) for b in it]
    made = []
    make_batch = stacking.make_batch

    def spy(*args):
        made.append(None)  # (stays None if it raises: NoRoom)
        batch = make_batch(*args)
        made[-1] = batch is not None
        return batch

    monkeypatch.setattr(stacking, "make_batch", spy)
    with ds.loader(workers=0, slot_size=64 << 20) as it:
        inline = [np.array(b) for b in it]
    assert made and all(made), made  # made in pieces, every batch
    made.clear()
    with ds.loader(workers=0, slot_size=16 << 20) as it:  # slots too small, and never grown
        small = [np.array(b) for b in it]
    assert made == [], made  # less room than the records' bytes: made whole, never tried
    x4 = al.Dataset.from_arrayrecord(big).shuffle(5).repeat(2).map(fns.as_uint8_x4).batch(40)
    # (room for the records' bytes, not for the batch)
    tiled = [np.array(b) for b in x4.loader(workers=0, slot_size=64 << 20)]
    assert made == [None], made  # tried once (it found no room), then made whole at once
    monkeypatch.setattr(stacking, "MIN_TASK_BYTES", 1 << 40)
    with ds.loader(workers=0) as it:
        whole = [np.array(b) for b in it]
    assert len(got) == len(whole) == 4
    for a, b, c, d, e in zip(got, inline, whole, small, tiled):
        assert a.tobytes() == b.tobytes() == c.tobytes() == d.tobytes()
        assert e.tobytes() == np.tile(a, 4).tobytes()


def test_pieces_that_do_not_stack_give_the_whole_batch_and_exact_op_counts(big):
    """A number that is an int in some pieces and a float in others: the batch is made
    whole (floats throughout, as collate makes them), and each record is counted once by
    the transform's stats although a piece was transformed before the pieces gave way."""
    from ..support import worker_start_fns as wfns

    ds = al.Dataset.from_arrayrecord(big).shuffle(2).map(wfns.drifting).batch(40)
    got = {}
    for workers, slot in ((0, 64 << 20), (1, 32 << 20)):
        with ds.loader(workers=workers, slot_size=slot) as it:
            got[workers] = [{k: np.array(v) for k, v in b.items()} for b in it]
            counted = it.stats().as_dict()["transforms"]
        assert [t["items"] for t in counted.values()] == [80], counted
    for a, b in zip(*got.values()):
        assert a["y"].dtype == np.float64 and a["y"].tolist() == b["y"].tolist()
        assert a["x"].tobytes() == b["x"].tobytes()
