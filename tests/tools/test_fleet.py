"""The fleet model's pure parts (benchmarks/fleet.py): the bucket ramp, conservation of
requests and bytes, and what each strategy reads per useful byte."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fleet import (
    GB,
    KIB,
    MIB,
    Cases,
    Params,
    bucket_step,
    main,
    parse_size,
    ramp_limit,
    simulate,
    time_to_steady,
)

FAST = settings(max_examples=25, deadline=None)
demands = st.lists(st.floats(0, 1e8, allow_nan=False), min_size=1, max_size=200)


@FAST
@given(demands, st.floats(100, 1e6), st.floats(60, 3600))
def test_the_bucket_serves_at_most_its_capacity_and_ramps_no_faster_than_the_model(
        demand, max_reads, doubling):
    p = Params(bucket_max_reads=max(max_reads, 5000.0), doubling_s=doubling)
    cap = np.array([p.bucket_reads])
    for t, d in enumerate(demand):
        frac, nxt = bucket_step(cap, np.array([d]), p)
        assert 0 <= frac[0] <= 1
        assert frac[0] * d <= cap[0] * (1 + 1e-9)  # served ≤ capacity
        assert frac[0] == 1.0 or d > cap[0]  # refused only over capacity
        assert cap[0] <= nxt[0] <= ramp_limit(p, t + 1) * (1 + 1e-9)
        assert nxt[0] <= p.bucket_max_reads
        assert nxt[0] == cap[0] or d > cap[0]  # grows only under pressure
        cap = nxt


def _run(strategies, datasets, records, hosts, seconds=120, **kw):
    p = Params(seconds=seconds, **kw)
    return p, simulate(Cases.grid(strategies, datasets, records, hosts), p)


sizes = st.sampled_from([KIB, 10 * KIB, 100 * KIB, MIB])
datasets = st.sampled_from([GB, 20 * GB, 100 * GB])
hosts = st.sampled_from([1, 3, 64, 1000])


@FAST
@given(sizes, datasets, hosts)
def test_block_shuffle_reads_each_useful_byte_once(record, dataset, n):
    p, run = _run(["block"], [dataset], [record], [n])
    assert run.read_bytes[0] == pytest.approx(run.consumed[0] * record, rel=1e-9)
    assert run.later_ratio[0] == 1.0
    if np.isfinite(run.epoch1_s[0]) and run.epoch1_s[0] <= p.seconds:
        useful = dataset / n
        # Whole blocks: at most one block's worth past the epoch's end, one second's reads.
        assert run.epoch1_bytes[0] / useful <= 1 + (run.rate[0].max() * record) / useful


@FAST
@given(st.sampled_from(["exact", "disk", "block", "memory"]), sizes, datasets, hosts)
def test_requests_and_bytes_add_up(strategy, record, dataset, n):
    p, run = _run([strategy], [dataset], [record], [n])
    assert run.consumed[0] == pytest.approx(run.rate[0].sum(), rel=1e-9)
    assert (run.rate[0] >= 0).all()
    local = p.local_records(np.array([record]))[0]
    assert run.rate[0].max() <= local * (1 + 1e-9)  # never faster than the local pipeline
    if strategy == "exact":  # one GET per record, of the record's bytes
        assert run.requests[0] == pytest.approx(run.consumed[0], rel=1e-9)
        assert run.read_bytes[0] == pytest.approx(run.consumed[0] * record, rel=1e-9)
    if strategy in ("memory", "disk"):  # a fill never reads past what it keeps
        kept = dataset if strategy == "memory" else min(dataset, p.disk)
        misses = run.consumed[0] * record if strategy == "disk" else 0.0
        assert run.read_bytes[0] <= kept + misses + 1e-6
        assert 0.0 <= run.later_ratio[0] <= 1.0
    if strategy == "memory" and run.epoch1_s[0] <= p.seconds:
        # No record is served before its bytes arrive: epoch 1 read at least its bytes.
        assert run.epoch1_bytes[0] >= dataset / n * (1 - 1e-9)


def test_more_hosts_never_give_a_host_more_from_a_request_bound_bucket():
    # A host of ~4.5k GET/s (220 µs each): 1 host fits under 5,000 reads/s; 1,000 hosts are
    # throttled the whole 15 minutes.
    p, run = _run(["exact"], [100 * GB], [KIB], [1, 2, 8, 64, 1000], seconds=900,
                  get_cpu_us=220.0)
    assert (np.diff(run.rate, axis=0) <= 1e-9).all()
    assert run.throttled_s[0] == 0 and run.throttled_s[-1] == p.seconds
    assert not np.isfinite(time_to_steady(run, p)[-1])


def test_the_ramp_takes_log2_doublings():
    """1,000 hosts at ~7.1k GET/s each need ~1,400× the initial 5,000 reads/s: ~10.5 doublings
    (of 20 minutes in GCS, so ~3.5 hours of throttling; 1 minute here, to keep it fast)."""
    p, run = _run(["exact"], [10**13], [KIB], [1000], seconds=900, doubling_s=60.0)
    need = run.unthrottled_rate[0] * 1000 / p.bucket_reads
    expected = np.log2(need) * p.doubling_s
    assert run.throttled_s[0] == pytest.approx(expected, rel=0.02)
    assert time_to_steady(run, p)[0] == pytest.approx(expected, rel=0.03)


def test_the_dataset_kept_in_memory_is_only_where_it_fits():
    _p, run = _run(["memory"], [100 * GB, 10**13], [KIB], [8])
    assert run.fits.tolist() == [True, False]
    assert run.bound[1] == "doesn't fit" and run.rate[1].max() == 0
    assert run.later_ratio[0] == 0.0


def test_the_disk_tier_speeds_up_as_it_fills():
    _p, run = _run(["exact", "disk"], [20 * GB], [KIB], [1], seconds=1200)
    exact, disk = run.rate
    assert disk[-1] > 10 * exact[-1]  # filled: local speed
    assert (np.diff(disk) >= -1e-6).all()  # never slower as coverage grows
    assert run.later_ratio[1] == 0.0


def test_it_is_deterministic():
    a = _run(["exact", "disk", "block", "memory"], [GB], [KIB], [1, 64])[1]
    b = _run(["exact", "disk", "block", "memory"], [GB], [KIB], [1, 64])[1]
    assert np.array_equal(a.rate, b.rate) and a.bound == b.bound


def test_sizes_parse():
    assert parse_size("100GB") == 10**11
    assert parse_size("1KiB") == 1024
    assert parse_size("4 MiB") == 4 << 20
    assert parse_size("1.5TB") == 1_500_000_000_000
    with pytest.raises(Exception, match="not a size"):
        parse_size("12 parsecs")


def test_the_cli_prints_a_table(capsys):
    assert main(["--datasets", "1GB", "--hosts", "1", "4", "--seconds", "120"]) == 0
    out = capsys.readouterr().out
    assert "| exact | 4 |" in out and "bound by" in out
