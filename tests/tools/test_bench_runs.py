"""The benchmarks' pure parts that decide what runs and what is reported: the order of a
round's runs (ABBA, the bare loops among them), and a profile read only from a child that
finished."""

from __future__ import annotations

from benchmarks.bench_readahead import profiled
from benchmarks.efficiency import round_order


def test_every_other_round_runs_in_the_reverse_order():
    first = round_order(["main", "branch"], [0, 2], 0)
    assert first == ["bare", ("main", 0), ("main", 2), ("branch", 0), ("branch", 2)]
    assert round_order(["main", "branch"], [0, 2], 1) == first[::-1]
    assert round_order(["main", "branch"], [0, 2], 2) == first
    # each pair of tree runs swaps order from one round to the next
    for r in range(4):
        order = round_order(["main", "branch"], [0], r)
        assert (order.index(("main", 0)) < order.index(("branch", 0))) == (r % 2 == 0)


def test_the_bare_loop_that_batches_runs_beside_the_bare_loop_in_each_round():
    plain = round_order(["main"], [0, 1], 0)
    assert "floor" not in plain
    first = round_order(["main"], [0, 1], 0, floor=True)
    assert first == ["bare", "floor", ("main", 0), ("main", 1)]
    assert round_order(["main"], [0, 1], 1, floor=True) == first[::-1]


def test_a_child_that_timed_out_or_wrote_no_samples_has_no_profile(tmp_path):
    raw = tmp_path / "run.txt"
    assert profiled(raw, {"error": "timeout"}) is None
    assert profiled(raw, {"records": 10}) is None  # no file written
    raw.write_text("main (a.py:1);work (b.py:2) 5\n")
    assert profiled(raw, {"error": "timeout"}) is None  # samples of a run cut short
    assert "work" in profiled(raw, {"records": 10})
