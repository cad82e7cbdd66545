"""The stats over time: the bounded ring of snapshots (property tests over any ticks) and the
per-interval rates read from them; then what `PipelineStats` keeps in it."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.runtime.stats import PipelineStats
from aioloader.runtime.timeline import Timeline, rates


class Counter:
    """A probe whose counters grow by known amounts: `batches` by 1 a tick, `busy:s` by
    the time passed (a stage busy all the time)."""

    def __init__(self) -> None:
        self.batches = 0

    def __call__(self, t: float) -> dict[str, float]:
        return {"batches": self.batches, "busy:s": t, "cores:s": 1}


gaps = st.lists(st.floats(min_value=0.0, max_value=5.0, allow_nan=False), max_size=400)


@settings(max_examples=150, deadline=None)
@given(gaps=gaps, interval=st.floats(0.05, 2.0), most=st.integers(3, 40))
def test_the_ring_stays_bounded_ordered_and_keeps_the_start_and_every_count(gaps, interval,
                                                                            most):
    probe = Counter()
    tl = Timeline(probe, interval=interval, max_samples=most)
    tl.take(0.0)
    t, taken = 0.0, []
    for gap in gaps:
        t += gap
        probe.batches += 1
        if tl.tick(t):
            taken.append(t)
    kept = tl.samples()
    assert 1 <= len(kept) <= most
    assert kept[0] == {"batches": 0, "busy:s": 0.0, "cores:s": 1, "t": 0.0}
    times = [s["t"] for s in kept]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert set(times[1:]) <= set(taken)  # only snapshots taken, none made up
    # the interval doubles each time the ring is halved: it never drops under the start's
    assert tl.interval >= interval
    # cumulative counters: the rates over the kept snapshots add up to the last one's count
    r = rates(kept, ["s"])
    spans = [b - a for a, b in pairwise(times)]
    assert sum(v * dt for v, dt in zip(r["batches_per_s"], spans)) == pytest.approx(
        kept[-1]["batches"])
    assert all(v == pytest.approx(100.0) for v in r["busy_pct"]["s"])  # busy all the time
    # with `now`, the figures up to then (not kept)
    later = tl.samples(now=t + 1.0)
    assert later[-1]["t"] == t + 1.0 and later[-1]["batches"] == len(gaps)
    assert len(tl.samples()) == len(kept)


def test_a_tick_before_the_interval_takes_nothing_and_time_cannot_go_back():
    tl = Timeline(Counter(), interval=0.5)
    tl.take(0.0)
    assert not tl.tick(0.4) and tl.tick(0.5) and len(tl) == 2
    with pytest.raises(ValueError, match="comes after"):
        tl.take(0.2)


@pytest.mark.parametrize("kw", [{"interval": 0}, {"interval": -1.0}, {"max_samples": 2}])
def test_a_timeline_refuses_settings_it_cannot_keep(kw):
    with pytest.raises(ValueError):
        Timeline(Counter(), **kw)


def test_rates_per_interval():
    samples = [
        {"t": 0.0, "batches": 0, "records": 0, "wait_s": 0.0, "busy:w": 0.0, "cores:w": 2,
         "io_busy_s": 0.0, "cache_hits": 0, "cache_misses": 0, "retries": 0},
        {"t": 2.0, "batches": 10, "records": 640, "wait_s": 0.5, "busy:w": 3.0, "cores:w": 2,
         "io_busy_s": 8.0, "cache_hits": 6, "cache_misses": 2, "retries": 1},
        {"t": 2.0, "batches": 10},  # no length: skipped
        {"t": 3.0, "batches": 14, "records": 900, "wait_s": 2.0, "busy:w": 3.5, "cores:w": 2,
         "io_busy_s": 8.0, "cache_hits": 6, "cache_misses": 2, "retries": 3},
    ]
    r = rates([samples[0], samples[1], samples[3]], ["w"])
    assert r["t"] == [2.0, 3.0]
    assert r["batches_per_s"] == [5.0, 4.0] and r["records_per_s"] == [320.0, 260.0]
    assert r["wait_pct"] == [25.0, 100.0]  # 1.5 s in 1 s: figures landing late, capped
    assert r["busy_pct"]["w"] == [75.0, 25.0]  # per core: 3 core-s of 2 x 2 s
    assert r["reads_in_flight"] == [4.0, 0.0]
    assert (r["cache_hits_per_s"], r["cache_misses_per_s"]) == ([3.0, 0.0], [1.0, 0.0])
    assert r["retries"] == [1, 3]
    assert rates(samples[1:3], ["w"])["t"] == []


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_pipeline_stats_snapshot_as_batches_arrive_at_most_one_an_interval():
    clock = Clock()
    io = {"reads": 0, "bytes": 0, "retries": 0, "busy_seconds": 0.0}
    ps = PipelineStats(workers=2, clock=clock, io_source=lambda: dict(io),
                       cache_source=lambda: {"hits": 3, "misses": 1})
    for _ in range(32):  # a batch every 1/8 s for 4 s, after waiting 1/40 s for each
        clock.t += 0.125
        io["reads"] += 2
        io["busy_seconds"] += 0.375  # 3 reads in flight on average
        ps.records += 8
        ps.note_batch(0.025, ready=1)
    kept = ps.timeline.samples()
    assert [s["t"] for s in kept] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    r = rates(kept, list(ps.stages))
    assert r["batches_per_s"] == pytest.approx([8.0] * 8)
    assert r["records_per_s"] == pytest.approx([64.0] * 8)
    assert r["wait_pct"] == pytest.approx([20.0] * 8)
    assert r["reads_in_flight"] == pytest.approx([3.0] * 8)
    assert kept[-1]["reads"] == 64 and kept[-1]["cores:decode+transform"] == 2
    assert kept[-1]["cache_hits"] == 3
