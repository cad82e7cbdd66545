"""Stage and per-transform figures, busy per core, the table, its legend and as_dict: a
hand-driven clock (and one real local run, for what the table shows of local reads)."""

import json
import random
import re

import pytest

import aioloader as al
from aioloader.runtime.stagestats import StageStats
from aioloader.runtime.stats import PipelineStats
from aioloader.runtime.table import FOOTER


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


def test_stage_counts_items_total_mean_and_longest_call(clock):
    st = StageStats("fetch", clock=clock)
    t0 = st.begin()
    clock.t += 0.2
    st.end(t0, items=4)
    with st.timed() as call:
        clock.t += 0.6
        call.items = 2
    st.add(10, 1.0)
    assert (st.count, st.calls) == (16, 3)
    assert st.total == pytest.approx(1.8) and st.max == pytest.approx(1.0)
    assert st.mean == pytest.approx(1.8 / 16)
    assert (st.items, st.seconds) == (st.count, st.total)  # the names loader.py used


def test_a_call_that_raises_is_still_counted(clock):
    st = StageStats("fetch", clock=clock)
    with pytest.raises(KeyError), st.timed(items=3):
        clock.t += 0.5
        raise KeyError
    assert (st.count, st.in_flight) == (3, 0) and st.total == pytest.approx(0.5)


def test_concurrent_calls_on_one_loop_are_busy_at_most_all_the_time(clock):
    st = StageStats("fetch", clock=clock)
    starts = [st.begin() for _ in range(12)]  # 12 awaits in flight together for 1 s
    clock.t += 1.0
    for t0 in starts:
        st.end(t0)
    clock.t += 1.0  # then idle for 1 s
    assert st.total == pytest.approx(12.0) and st.peak_in_flight == 12
    assert st.busy_fraction(2.0) == pytest.approx(0.5)


def test_busy_is_per_core_for_a_stage_shared_by_workers(clock):
    st = StageStats("decode+transform", cores=2, clock=clock)
    a = st.begin()
    clock.t += 1.0  # one worker busy
    b = st.begin()
    clock.t += 1.0  # both busy
    st.end(a)
    st.end(b)
    assert st.busy_fraction(2.0) == pytest.approx((1 + 2) / 4)
    # figures timed in the workers count as reported, shared over the cores
    st2 = StageStats("decode+transform", cores=2, clock=clock)
    st2.add(64, 0.95)
    st2.add(64, 0.95)
    assert st2.busy_fraction(1.0) == pytest.approx(0.95)


def test_calls_in_flight_count_up_to_now(clock):
    st = StageStats("fetch", clock=clock)
    st.begin()
    clock.t += 0.5
    assert st.busy_seconds() == pytest.approx(0.5) and st.in_flight == 1


def test_per_op_figures_merge_over_tasks(clock):
    ps = PipelineStats(workers=2, clock=clock)
    ps.add_ops(["map(f)", "filter(g)"], [32, 32], [0.4, 0.1])
    ps.add_ops(["map(f)", "filter(g)"], [32, 32], [0.2, 0.3])
    f, g = ps.transforms["map(f)"], ps.transforms["filter(g)"]
    assert (f.count, f.tasks) == (64, 2) and f.total == pytest.approx(0.6)
    assert f.max == pytest.approx(0.4) and g.max == pytest.approx(0.3)
    assert f.mean == pytest.approx(0.6 / 64)
    assert list(ps.transforms) == ["map(f)", "filter(g)"]  # pipeline order


def test_the_same_op_twice_gets_two_rows(clock):
    ps = PipelineStats(clock=clock)
    for _ in range(3):
        ps.add_ops(["map(f)", "map(f)"], [8, 8], [0.1, 0.5])
    assert list(ps.transforms) == ["map(f)", "map(f) #2"]
    assert ps.transforms["map(f) #2"].total == pytest.approx(1.5)


def test_add_ops_refuses_lists_that_do_not_line_up(clock):
    with pytest.raises(ValueError, match="2 names, 1 item counts"):
        PipelineStats(clock=clock).add_ops(["a", "b"], [1], [0.1, 0.2])


def _run(clock: Clock) -> PipelineStats:
    """Two workers decode+transform 4 tasks of 64 records for 4 s, one batch each."""
    ps = PipelineStats(workers=2, prefetch=4, clock=clock,
                       graph=["source(a.array_record)", "map(f)", "batch(64)"],
                       io_source=lambda: {"reads": 6, "requests": 6, "bytes": 3_000_000,
                                          "retries": 0, "hedges": 0, "hedge_wins": 0,
                                          "peak_in_flight": 3},
                       cache_source=lambda: {"hits": 5, "misses": 2, "bytes": 1_000_000,
                                             "horizons": 3, "horizons_per_epoch": 2,
                                             "horizon_records": 546})
    for _ in range(4):
        with ps.fetch.timed(items=64):
            clock.t += 0.1
        ps.process.add(64, 0.95)
        ps.add_ops(["decode", "map(f)"], [64, 64], [0.15, 0.8])
        ps.records += 64
        ps.elements += 64
        clock.t += 0.4
        ps.note_batch(waited=0.01, ready=2)
    ps.add_worker_reads(4, 1_000_000)
    return ps


def test_as_dict_keeps_every_key_and_adds_transforms(clock):
    d = _run(clock).as_dict()
    assert {"records", "batches", "elements", "wait_fraction", "wait_s", "io", "cache",
            "stages", "time_to_first_batch_s", "records_per_s", "mean_ready_batches",
            "workers", "prefetch", "elapsed_s", "transforms", "executor"} <= set(d)
    assert (d["records"], d["elements"], d["batches"], d["workers"]) == (256, 256, 4, 2)
    assert d["executor"] == "processes"
    assert d["elapsed_s"] == pytest.approx(2.0) and d["records_per_s"] == pytest.approx(128)
    assert d["wait_s"] == pytest.approx(0.04) and d["wait_fraction"] == pytest.approx(0.02)
    assert d["time_to_first_batch_s"] == pytest.approx(0.5)
    assert d["mean_ready_batches"] == 2.0
    assert list(d["stages"]) == ["fetch", "decode+transform", "assemble"]
    proc = d["stages"]["decode+transform"]
    assert proc["busy_fraction"] == pytest.approx(3.8 / 2 / 2) and proc["cores"] == 2
    assert {"items", "busy_s", "peak_in_flight", "total_s", "mean_s", "max_s"} <= set(proc)
    m = d["transforms"]["map(f)"]
    assert (m["items"], m["tasks"], m["stage"]) == (256, 4, "decode+transform")
    assert m["max_s"] == pytest.approx(0.8) and m["busy_fraction"] == pytest.approx(0.8)
    json.dumps(d)  # for machines


def test_io_adds_the_workers_own_reads_without_touching_storage(clock):
    ps = _run(clock)
    io = ps.io
    assert (io["reads"], io["requests"], io["bytes"]) == (10, 10, 4_000_000)
    assert (io["worker_reads"], io["worker_bytes"]) == (4, 1_000_000)
    assert io["records_per_read"] == pytest.approx(25.6)
    assert ps.io_source()["reads"] == 6
    assert ps.cache == {"hits": 5, "misses": 2, "bytes": 1_000_000, "horizons": 3,
                        "horizons_per_epoch": 2, "horizon_records": 546}


def test_io_and_cache_may_be_set_as_dicts(clock):
    ps = PipelineStats(clock=clock)
    assert ps.io == {} and ps.cache == {}
    ps.records = 10
    ps.io = {"reads": 5, "bytes": 10}
    ps.cache = {"hits": 1, "misses": 0}
    ps.cache.update(resident_bytes=3, resident_segments=1)
    assert ps.io["records_per_read"] == 2.0
    assert ps.as_dict()["cache"]["resident_segments"] == 1


def test_the_table(clock):
    text = str(_run(clock))
    lines = text.splitlines()
    assert lines[0] == "pipeline: source(a.array_record) -> map(f) -> batch(64)"
    assert "4 batches, 256 records in 2.00 s (128 records/s); first batch after 0.500 s" in text
    assert "consumer waited 0.04 s (2.0% of the time); 2.0 of 4 batches ready" in text
    assert "executor: processes, 2 workers" in lines
    header = next(ln for ln in lines if ln.startswith("stage"))
    for col in ("items", "total s", "per item", "max call", "busy", "peak in flight"):
        assert col in header
    proc = next(ln for ln in lines if ln.startswith("decode+transform"))
    assert "95% of 2 workers" in proc and "3.80" in proc and "950.0 ms" in proc
    fetch = next(ln for ln in lines if ln.startswith("fetch"))
    assert "20%" in fetch and "of 2" not in fetch
    k = lines.index(proc)
    assert lines[k + 1].startswith("  decode ") and lines[k + 2].startswith("  map(f) ")
    assert "80% of 2 workers" in lines[k + 2] and "800.0 ms" in lines[k + 2]
    assert not any(ln.startswith("assemble") for ln in lines)  # a stage that did nothing
    assert "I/O: 10 reads (4 by the workers), 4.0 MB (2.0 MB/s)" in text
    assert "25.6 records per read" in text
    assert "chunk cache: 5 hits, 2 misses, 1.0 MB held" in text


def test_no_busy_figure_reads_over_100_percent(clock):
    ps = PipelineStats(workers=2, clock=clock)
    starts = [ps.fetch.begin() for _ in range(64)]
    t1 = [ps.process.begin() for _ in range(8)]  # more tasks in flight than workers
    clock.t += 1.0
    for t0 in starts:
        ps.fetch.end(t0)
    for t0 in t1:
        ps.process.end(t0, items=32)
    text = str(ps)
    busy = [int(w.rstrip("%")) for ln in text.splitlines() for w in ln.split()
            if w.endswith("%") and w[:-1].isdigit()]
    assert busy and max(busy) == 100


def test_stages_register_in_pipeline_order(clock):
    ps = PipelineStats(clock=clock)
    plan = ps.stage("plan", after="fetch")
    assert ps.stage("plan") is plan
    ps.stage("to device")
    assert list(ps.stages) == ["fetch", "plan", "decode+transform", "assemble", "to device"]
    assert (ps.fetch.name, ps.process.name, ps.assemble.name) == (
        "fetch", "decode+transform", "assemble")


def _columns(text: str) -> list[str]:
    header = next(ln for ln in text.splitlines() if ln.startswith("stage "))
    return re.split(r"\s{2,}", header.strip())


def _explained(legend: str, label: str) -> bool:
    return re.search(rf"^  {re.escape(label)}(\s|:)", legend, re.M) is not None


def test_the_legend_explains_every_column_row_and_line_the_table_prints(clock):
    ps = _run(clock)
    text, legend = str(ps), ps.legend()
    columns = _columns(text)
    assert len(columns) >= 7  # derived from the table: a new column must be explained
    rows = [ln.split("  ")[0] for ln in text.splitlines()
            if ln and not ln.startswith((" ", "-", "stage ")) and ln.split()[0] in ps.stages]
    assert rows == ["fetch", "decode+transform"]
    lines = [ln.split(":")[0] for ln in text.splitlines() if re.match(r"^[A-Za-z/ ]+: ", ln)]
    assert {"pipeline", "executor", "I/O", "chunk cache",
            "exact shuffle over large chunks"} <= set(lines)
    for label in [*columns, *rows, *lines, *ps.stages, "  transform"]:
        assert _explained(legend, label.strip()), label
    for words in ("first batch after", "consumer waited", "batches ready", "records per read",
                  "by the workers", "hedges", "kept in memory"):
        assert words in legend, words
    assert text.splitlines()[-1] == FOOTER  # print(it.stats()) points to it, once
    # horizons: how many an epoch, each of how many records (not an epoch of that many)
    assert "2 horizons an epoch, of 546 records each (3 filled)" in text


def test_the_ray_executors_figures_make_a_line_the_legend_explains(clock):
    ps = _run(clock)
    assert "Ray actors" not in str(ps)  # (the process pool's figures: no such line)
    ps.transfer_source = lambda: {"actors": 2, "by_value": 10, "calls": 6, "reruns": 1,
                                  "replaced": 1,
                                  "sent_bytes": 3_000_000, "wait_ms": 50, "return_ms": 20,
                                  "actor0_tasks": 6, "actor0_ms": 1200, "actor1_tasks": 4,
                                  "actor1_ms": 800}
    line = next(ln for ln in str(ps).splitlines() if ln.startswith("Ray actors:"))
    assert line == ("Ray actors: 2, tasks (time running them) 6 (1.20 s) / 4 (800.0 ms) in "
                    "6 calls; "
                    "1 reruns (1 actors replaced), 3.0 MB sent with tasks; per task 5.0 ms "
                    "to start, 2.0 ms back")
    assert _explained(ps.legend(), "Ray actors")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_local_run_shows_its_reads_and_says_what_is_not_measured(tmp_path, workers):
    paths = []
    for k in range(2):
        path = tmp_path / f"d-{k}.array_record"
        with al.ArrayRecordWriter(path, group_size=4) as w:
            for i in range(k, 800, 2):
                w.write(random.Random(i).randbytes(1000))  # incompressible
        paths.append(str(path))
    ds = al.Dataset.from_arrayrecord(paths).shuffle(1).batch(50)
    with ds.loader(workers=workers) as it:
        assert sum(1 for _ in it) == 16
        text, io = str(it.stats()), it.stats().io
    assert io["worker_reads"] > 0 and io["worker_bytes"] >= 800_000
    io_line = next(ln for ln in text.splitlines() if ln.startswith("I/O:"))
    reads = int(re.match(r"I/O: ([\d,]+) reads", io_line)[1].replace(",", ""))  # type: ignore[index]
    assert reads == io["reads"] > 0 and " 0.0 MB" not in io_line
    assert "by the workers" in io_line and "not measured" in io_line
    assert " 0 us" not in text and "peak 0 " not in text
    assert not any(ln.startswith("fetch ") for ln in text.splitlines())  # the workers read


def test_reads_made_only_by_the_workers_have_no_peak_in_flight_of_0(clock):
    ps = PipelineStats(workers=2, clock=clock, io_source=lambda: {
        "reads": 0, "requests": 0, "bytes": 0, "peak_in_flight": 0})
    ps.records = 40
    ps.add_worker_reads(10, 40_000)
    clock.t += 1.0
    io_line = next(ln for ln in str(ps).splitlines() if ln.startswith("I/O:"))
    assert io_line.startswith("I/O: 10 reads (10 by the workers), 0.040 MB (0.040 MB/s)")
    assert "peak in flight not measured" in io_line and "peak 0" not in io_line


@pytest.mark.parametrize("spill, said", [
    ({}, "no spill: each chunk decoded once per horizon"),
    ({"spill_bytes": 0, "spill_hits": 0, "spill_refused": 1},
     "spill refused (disk full): each chunk decoded once per horizon"),
    ({"spill_bytes": 2_000_000, "spill_hits": 9, "spill_refused": 1},
     "the spill holds 2.0 MB of decoded records and served 9 chunks' fills without "
     "decoding them (then refused (disk full)"),
])
def test_the_table_says_whether_the_spill_was_refused(clock, spill, said):
    ps = _run(clock)
    ps.cache_source = lambda: {"horizons": 3, "horizons_per_epoch": 2,
                               "horizon_records": 546, **spill}
    assert said in str(ps)
