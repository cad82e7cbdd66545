"""The block shuffle over byte runs (issue 15): coverage, determinism, exact resume, disjoint
per-process shares that stay within each process's lane, and elastic resume across process
counts — on pure prefix sums (group sizes 1, 64, 65536) and on real files."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.describe.plan import SourceMeta, compile, longest_shard
from aioloader.describe.state import LoaderState
from aioloader.errors import StateError
from aioloader.index.blocks import BlockShuffle, Windows
from aioloader.index.permutation import window_lanes
from aioloader.index.planning import cut_runs
from aioloader.options import LoaderOptions

from ..support import pipeline_fns as fns

DS = al.Dataset.from_arrayrecord("/data/train-*.array_record")


def _meta(num_records: int, group_size: int, record_bytes: int = 100,
          files: int = 2) -> SourceMeta:
    """A chunk table like `files` files of `group_size`-record chunks, cut by `cut_runs`."""
    per_file = [len(a) for a in np.array_split(np.arange(num_records), files)]
    counts, owner = [], []
    for f, n in enumerate(per_file):
        c = [group_size] * (n // group_size) + ([n % group_size] if n % group_size else [])
        counts += c
        owner += [f] * len(c)
    counts_a = np.array(counts, dtype=np.int64)
    record_starts = np.concatenate(([0], np.cumsum(counts_a)))
    size = counts_a * record_bytes
    ends = np.zeros_like(size)
    start = np.zeros_like(size)
    for f in range(files):  # chunk offsets restart in each file
        m = np.array(owner) == f
        ends[m] = np.cumsum(size[m])
        start[m] = ends[m] - size[m]

    def blocks(target: int) -> tuple[np.ndarray, np.ndarray]:
        runs = cut_runs(np.array(owner), start, ends, target)
        return record_starts[runs.chunk], runs.end - runs.start

    return SourceMeta(num_records, record_starts, True, False, "headers", blocks)


def _stream(ds: al.Dataset, meta: SourceMeta, procs: int, lo: int, hi: int,
            layout=()) -> list[list[tuple[int, int]]]:
    """Global batches `lo..hi-1` of `procs` processes, as (record, epoch) pairs (each
    process's batch concatenated)."""
    plans = [compile(ds, meta, LoaderOptions(), procs=(p, procs), layout=layout)
             for p in range(procs)]
    b = plans[0].unit
    if hi <= lo:
        return []
    parts = [pl.index.lookup(np.arange(lo * b, hi * b)) for pl in plans]
    pairs = [list(zip(r.tolist(), e.tolist())) for r, e in parts]
    return [[x for p in pairs for x in p[(k - lo) * b:(k - lo + 1) * b]] for k in range(lo, hi)]


# -- the pure core ---------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(windows=st.integers(1, 5), per=st.integers(1, 4), lanes=st.sampled_from([1, 2, 4]),
       batch=st.integers(1, 5), tail=st.integers(0, 30), key=st.integers(0, 2**64 - 1))
def test_window_lanes_permute_each_window_and_keep_each_lane_slice_in_its_lane(
        windows, per, lanes, batch, tail, key):
    group = batch * lanes
    size = group * per
    n = windows * size + tail
    out = window_lanes(np.arange(n), key, size, group, np.full(n, lanes), n)
    assert sorted(out.tolist()) == list(range(n))
    for g in range(windows):  # full windows: a permutation of the window, lane by lane
        w = out[g * size:(g + 1) * size]
        assert sorted(w.tolist()) == list(range(g * size, (g + 1) * size))
        lane_of = (w - g * size) // (size // lanes)
        slot_lane = (np.arange(size) % group) // batch  # the process a position is dealt to
        assert np.array_equal(lane_of, slot_lane)
    assert sorted(out[windows * size:].tolist()) == list(range(windows * size, n))


def test_windows_validates_its_layout():
    with pytest.raises(ValueError, match="multiple of the global batch"):
        Windows(1, 10, 4)
    with pytest.raises(ValueError, match="divide the global batch"):
        Windows(1, 12, 4, 3)
    with pytest.raises(ValueError, match="increasing"):
        Windows(1, 12, 4, 2, ((8, 2), (4, 1)))
    with pytest.raises(ValueError):
        BlockShuffle(1, -1)
    w = Windows(1, 8, 4, 4, ((16, 2), (40, 1)))
    assert w.lanes_at(np.array([0, 8, 16, 32, 40, 48])).tolist() == [2, 2, 1, 1, 4, 4]


# -- coverage, determinism, resume: one process ------------------------------------------


@settings(max_examples=30, deadline=None)
@given(group=st.sampled_from([1, 64, 65536]), n=st.integers(1, 3000),
       block=st.sampled_from([100, 1000, 7000]), window=st.integers(1, 40000),
       seed=st.integers(0, 2**32), cut=st.integers(0, 6000))
def test_one_process_covers_every_record_once_per_epoch_and_resumes_anywhere(
        group, n, block, window, seed, cut):
    ds = DS.shuffle(seed, strategy="block", block_bytes=block, window_bytes=window).repeat(2)
    plan = compile(ds, _meta(n, group), LoaderOptions())
    records, epochs = plan.index.lookup(np.arange(2 * n))
    for e in (0, 1):
        assert sorted(records[epochs == e].tolist()) == list(range(n))
    cut = min(cut, 2 * n)  # resume: positions looked up from any place give the same
    again = compile(ds, _meta(n, group), LoaderOptions()).index.lookup(np.arange(cut, 2 * n))
    assert np.array_equal(again[0], records[cut:])


def test_a_window_draws_from_few_blocks_and_the_knobs_change_the_fingerprint():
    n, record = 20000, 100
    meta = _meta(n, 1, record, files=1)
    ds = DS.shuffle(1, strategy="block", block_bytes=10_000, window_bytes=40_000)
    plan = compile(ds, meta, LoaderOptions())
    records, _ = plan.index.lookup(np.arange(n))
    # 4 blocks of 100 records per window: every 400 outputs come from 4 runs of 100.
    for w in range(0, n, 400):
        assert len(np.unique(records[w:w + 400] // 100)) <= 4
    assert plan.window_bytes == 40_000
    other = DS.shuffle(1, strategy="block", block_bytes=10_000, window_bytes=80_000)
    assert other.describe() != ds.describe()
    assert DS.shuffle(1, strategy="block", block_bytes=20_000).describe() != ds.describe()


# -- dealt to processes ------------------------------------------------------------------


def _dealt(seed, block_bytes=1000, window_bytes=20_000, batch=4, epochs=2, drop=True):
    return (DS.shuffle(seed, strategy="block", block_bytes=block_bytes,
                       window_bytes=window_bytes)
            .repeat(epochs).shard_by_jax_process(drop_remainder=drop).batch(batch))


@settings(max_examples=25, deadline=None)
@given(group=st.sampled_from([1, 64, 65536]), n=st.integers(50, 1500),
       procs=st.sampled_from([1, 2, 3, 4]), seed=st.integers(0, 2**32))
def test_processes_take_disjoint_shares_that_cover_each_epoch(group, n, procs, seed):
    ds = _dealt(seed, drop=False, batch=4)
    meta = _meta(n, group)
    plans = [compile(ds, meta, LoaderOptions(), procs=(p, procs)) for p in range(procs)]
    got = [pl.index.lookup(np.arange(pl.length)) for pl in plans]
    records = np.concatenate([r for r, _ in got])
    epochs = np.concatenate([e for _, e in got])
    for e in (0, 1):
        assert sorted(records[epochs == e].tolist()) == list(range(n))
    lengths = [pl.length for pl in plans]
    assert longest_shard(plans[0], ds).length == max(lengths)


def test_each_process_reads_only_its_lane_of_each_window():
    n, record, procs, batch = 40_000, 100, 4, 8
    meta = _meta(n, 1, record, files=1)
    ds = _dealt(5, block_bytes=10_000, window_bytes=400_000, batch=batch, epochs=1)
    plans = [compile(ds, meta, LoaderOptions(), procs=(p, procs)) for p in range(procs)]
    size = next(op for op in plans[0].index.ops if isinstance(op, Windows)).size
    assert size == 4000 and plans[0].window_bytes == 100_000  # a quarter window each
    blocks = meta.blocks(10_000)[0]
    touched = []
    for pl in plans:
        records, _ = pl.index.lookup(np.arange(pl.length))
        b = np.searchsorted(blocks, records, side="right") - 1
        per_window = [set(b[w:w + size // procs].tolist())
                      for w in range(0, len(b), size // procs)]
        # a lane is a quarter window: 10 blocks of 100 records (at most 11 when it splits one)
        assert max(len(s) for s in per_window) <= 11
        touched.append(set(b.tolist()))
    total = sum(len(t) for t in touched)
    assert total <= len(blocks) - 1 + 2 * n // size  # ~each block read by one process


@settings(max_examples=25, deadline=None)
@given(group=st.sampled_from([1, 64, 65536]), n=st.integers(100, 1200),
       old=st.sampled_from([1, 2, 4]), new=st.sampled_from([1, 2, 4]),
       then=st.sampled_from([1, 2, 4]), frac=st.floats(0, 1), frac2=st.floats(0, 1),
       seed=st.integers(0, 2**32))
def test_elastic_resume_consumes_every_record_exactly_once(group, n, old, new, then, frac,
                                                           frac2, seed):
    """Saved at any step on `old` processes, resumed on `new`, saved again and resumed on
    `then`: the global batches before and after together are each epoch exactly once (minus
    the last partial global batch), and they do not depend on the process counts as sets."""
    G = 8
    meta = _meta(n, group)
    ds = {p: _dealt(seed, window_bytes=6_000, batch=G // p) for p in (1, 2, 4)}
    plan = compile(ds[old], meta, LoaderOptions(), procs=(0, old))
    steps = plan.length // plan.unit
    k1 = int(frac * steps)
    k2 = k1 + int(frac2 * (steps - k1))
    first = _stream(ds[old], meta, old, 0, k1)
    s = LoaderState(k1 * (G // old), 0, 0, G // old, old, tuple(plan.shape.fingerprint))
    s = s.resume_as(compile(ds[new], meta, LoaderOptions(), procs=(0, new)).shape.fingerprint,
                    G // new, new, True)
    second = _stream(ds[new], meta, new, k1, k2, s.layout)
    s = s.at(k2 * (G // new))
    s = s.resume_as(compile(ds[then], meta, LoaderOptions(), procs=(0, then))
                    .shape.fingerprint, G // then, then, True)
    third = _stream(ds[then], meta, then, k2, steps, s.layout)
    got = [x for batch in first + second + third for x in batch]
    assert len(got) == len(set(got)) == steps * G  # no record twice in an epoch
    assert steps * G > 2 * n - G  # only the last partial global batch is dropped
    if old == new == then:  # the same batches as a run that never stopped
        assert first + second + third == _stream(ds[old], meta, old, 0, steps)


def test_an_old_chunk_window_block_shuffle_state_says_why_it_cannot_resume():
    old = LoaderState(8, 0, 0, 8, 1, ("source(x)", "shuffle(seed=3, block)", "batch(8)"))
    now = tuple(DS.shuffle(3, strategy="block").batch(8).describe())
    with pytest.raises(StateError, match="block shuffle permuted chunks"):
        old.resume_as(now, 8, 1, True)
    with pytest.raises(TypeError, match="window_bytes"):
        DS.shuffle(3, strategy="block", window=16)


def test_a_layout_round_trips_and_bad_ones_are_refused():
    s = LoaderState(16, 0, 0, 8, 2, ("x",)).resume_as(("x",), 4, 4, True)
    assert s.layout == ((32, 2),) and s.position == 8
    assert LoaderState.from_json(s.to_json()) == s
    bad = {**s.to_json(), "layout": [[32, 0]]}
    with pytest.raises(StateError, match="layout"):
        LoaderState.from_json(bad)


# -- real files --------------------------------------------------------------------------


@pytest.mark.parametrize("group", [1, 64, 65536])
def test_real_files_of_any_group_size_give_each_record_once(tmp_path, group):
    from ..runtime.test_pipeline import _write

    n = 700
    paths = _write(tmp_path, n=n, shards=3, group=group)
    ds = (al.Dataset.from_arrayrecord(paths)
          .shuffle(4, strategy="block", block_bytes=2048, window_bytes=8192)
          .repeat(2).map(fns.decode).map(fns.only_id_noise_det).batch(32))
    loader = ds.loader(workers=0)
    ids = [i for b in loader for i in fns.ids_of(b)]
    assert sorted(ids) == sorted(list(range(n)) * 2)
    state = None
    loader = ds.loader(workers=0)
    head = []
    for k, b in enumerate(loader):
        head += fns.ids_of(b)
        if k == 9:
            state = loader.get_state()
            break
    rest = [i for b in ds.loader(workers=0, state=state) for i in fns.ids_of(b)]
    assert head + rest == ids


def test_loaders_of_simulated_processes_move_from_2_to_4_exactly(tmp_path, monkeypatch):
    """Real loaders over real files, each told it is process p of P (as jax would): 2
    processes stop mid-window, 4 resume from process 0's state; every record of both epochs
    comes exactly once, and the 4 read disjoint shares."""
    pytest.importorskip("jax")
    import aioloader.jax as aljax

    from ..runtime.test_pipeline import _write

    n, global_batch = 600, 16
    paths = _write(tmp_path, n=n, shards=3, group=8)

    def run(procs: int, state=None, stop=None):
        per = global_batch // procs
        ds = (al.Dataset.from_arrayrecord(paths)
              .shuffle(9, strategy="block", block_bytes=1024, window_bytes=6144)
              .repeat(2).shard_by_jax_process().map(fns.decode).map(fns.only_id_noise_det)
              .batch(per, drop_remainder=True))
        outs, states = [], []
        for p in range(procs):
            monkeypatch.setattr(aljax, "process_shard", lambda ds, p=p: (p, procs))
            loader = ds.loader(workers=0, state=state)
            got = []
            for k, b in enumerate(loader):
                got.append(fns.ids_of(b))
                if stop is not None and k + 1 == stop:
                    break
            outs.append(got)
            states.append(loader.get_state())
            loader.close()
        steps = len(outs[0])
        assert all(len(o) == steps for o in outs)
        return [[i for o in outs for i in o[k]] for k in range(steps)], states[0]

    first, state = run(2, stop=5)
    rest, _ = run(4, state=state)
    ids = [i for b in first + rest for i in b]
    assert len(ids) == (2 * n) // global_batch * global_batch
    counts = np.bincount(ids, minlength=n)
    assert counts.max() == 2 and counts.sum() == len(ids)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30),
       counts=st.data(), window=st.integers(1, 200), key=st.integers(0, 2**64 - 1))
def test_byte_windows_are_a_permutation_of_whole_blocks_of_about_window_bytes(
        sizes, counts, window, key):
    from aioloader.index.permutation import _slots, block_shuffle

    c = counts.draw(st.lists(st.integers(0, 9), min_size=len(sizes), max_size=len(sizes)))
    starts = np.concatenate(([0], np.cumsum(c))).astype(np.int64)
    n = int(starts[-1])
    out = block_shuffle(np.arange(n), starts, key, window, np.array(sizes))
    assert sorted(out.tolist()) == list(range(n))
    order, slots = _slots(starts, key)  # the windows: blocks by the stretch of their 1st byte
    byte_starts = np.cumsum(np.array(sizes)[order]) - np.array(sizes)[order]
    for w in np.unique(byte_starts // window):
        members = order[byte_starts // window == w]
        lo, hi = slots[np.flatnonzero(byte_starts // window == w)[[0, -1]] + [0, 1]]
        got = set(out[lo:hi].tolist())
        assert got == {r for b in members for r in range(starts[b], starts[b + 1])}


def test_a_window_of_large_chunks_holds_few_of_them():
    """The large-group cliff (issue 15, section 4): 1M records in 16 chunks of 65536 (about
    24 MiB each on disk); a 64 MiB window holds at most 3 of them, not the whole file."""
    meta = _meta(1 << 20, 65536, record_bytes=384, files=1)
    plan = compile(DS.shuffle(2, strategy="block"), meta, LoaderOptions())
    records, _ = plan.index.lookup(np.arange(1 << 20))
    chunk = records // 65536
    change = np.flatnonzero(np.diff(chunk)) + 1  # every window is a few whole chunks
    assert len(np.unique(chunk[:3 * 65536])) <= 3
    assert plan.window_bytes == 64 << 20 and len(change) > 16
