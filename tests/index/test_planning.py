"""Property tests of the read planner: exact coverage, caps, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioloader.index.planning import cut_runs, plan_reads

ranges = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 3_000)),
    max_size=200,
)


@settings(max_examples=300)
@given(ranges, st.integers(0, 5_000), st.integers(1, 20_000), st.floats(1.0, 10.0))
def test_every_range_is_covered_exactly(items, max_gap, max_merged, amplification):
    files = [f for f, _, _ in items]
    starts = [s for _, s, _ in items]
    ends = [s + n for _, s, n in items]
    plan = plan_reads(files, starts, ends, max_gap=max_gap, max_merged=max_merged,
                      max_amplification=amplification)
    # Each requested range lies wholly inside its read, in the right file.
    for i in range(len(items)):
        r = plan.item_read[i]
        assert plan.read_file[r] == files[i]
        lo = plan.read_start[r] + plan.item_offset[i]
        assert lo == starts[i]
        assert lo + plan.item_length[i] == ends[i] <= plan.read_end[r]
        assert plan.item_offset[i] >= 0
    # Reads are sorted, disjoint per file, and respect the cap unless one range alone is bigger.
    for r in range(plan.num_reads):
        size = plan.read_end[r] - plan.read_start[r]
        members = np.flatnonzero(plan.item_read == r)
        assert len(members) > 0
        biggest = max(ends[i] - starts[i] for i in members)
        touching = any(  # ranges that touch or overlap always merge, whatever the cap
            starts[i] <= ends[j] and starts[j] <= ends[i] and i != j
            for i in members for j in members
        )
        assert size <= max_merged or len(members) == 1 or biggest > max_merged or touching
        # Bytes read beyond what the ranges need stay bounded (gaps only bridged when cheap).
        covered = np.zeros(size, dtype=bool)
        for i in members:
            covered[starts[i] - plan.read_start[r] : ends[i] - plan.read_start[r]] = True
        assert size <= amplification * covered.sum() + 1e-9
        if r:
            prev = (plan.read_file[r - 1], plan.read_end[r - 1])
            assert (plan.read_file[r], plan.read_start[r]) >= prev


@given(ranges)
def test_zero_gap_zero_cap_merges_only_touching(items):
    files = [f for f, _, _ in items]
    starts = [s for _, s, _ in items]
    ends = [s + n for _, s, n in items]
    plan = plan_reads(files, starts, ends, max_gap=0, max_merged=1 << 40,
                      max_amplification=1e9)
    for r in range(1, plan.num_reads):
        if plan.read_file[r] == plan.read_file[r - 1]:
            assert plan.read_start[r] > plan.read_end[r - 1]


def test_contiguous_chunks_merge_into_one_read():
    starts = [64, 164, 300, 1000]
    ends = [164, 300, 1000, 1200]
    plan = plan_reads([0] * 4, starts[::-1], ends[::-1], max_gap=0)
    assert plan.num_reads == 1
    assert (plan.read_start[0], plan.read_end[0]) == (64, 1200)
    assert plan.item_offset.tolist() == [936, 236, 100, 0]


def test_duplicates_share_a_read_and_cap_splits():
    plan = plan_reads([0, 0, 0], [0, 0, 100], [50, 50, 150], max_gap=1000, max_merged=120)
    assert plan.num_reads == 2
    assert plan.item_read.tolist() == [0, 0, 1]


def test_sparse_ranges_are_not_bridged_beyond_the_amplification_cap():
    # 10-byte ranges 100 bytes apart: bridging would read ~10x what is needed.
    starts = list(range(0, 1000, 100))
    ends = [s + 10 for s in starts]
    assert plan_reads([0] * 10, starts, ends, max_gap=1000, max_amplification=4).num_reads == 10
    assert plan_reads([0] * 10, starts, ends, max_gap=1000, max_amplification=20).num_reads == 1


def test_bad_input():
    with pytest.raises(ValueError):
        plan_reads([0], [10], [5])
    with pytest.raises(ValueError):
        plan_reads([0, 1], [0], [1])
    assert plan_reads([], [], []).num_reads == 0


# --------------------------------------------------------------------------- cut_runs


@st.composite
def _chunk_tables(draw):
    files = draw(st.integers(1, 4))
    f, s, e = [], [], []
    for k in range(files):
        pos = draw(st.integers(0, 100))
        for size in draw(st.lists(st.integers(0, 300), max_size=30)):
            f.append(k)
            s.append(pos)
            e.append(pos + size)
            pos += size + draw(st.integers(0, 20))
    return f, s, e


@given(_chunk_tables(), st.integers(1, 1000))
def test_cut_runs_are_whole_chunks_of_one_file_closing_at_the_target(table, target):
    f, s, e = (np.asarray(x, dtype=np.int64) for x in table)
    runs = cut_runs(f, s, e, target)
    assert runs.chunk[0] == 0 and runs.chunk[-1] == len(f)
    assert (np.diff(runs.chunk) >= 1).all()
    for r in range(len(runs)):
        a, b = int(runs.chunk[r]), int(runs.chunk[r + 1])
        assert (f[a:b] == runs.file[r]).all()
        assert runs.start[r] == s[a] and runs.end[r] == e[b - 1]
        sizes = (e[a:b] - s[a:b]).tolist()
        # closes at the first chunk reaching the target, or at the file's end
        assert sum(sizes[:-1]) < target
        assert sum(sizes) >= target or b == len(f) or f[b] != f[b - 1]


_refs = st.integers(1, 6).flatmap(lambda files: st.tuples(
    st.just(files), st.lists(st.integers(0, files - 1), max_size=60),
    st.booleans(), st.booleans()))


@settings(max_examples=200)
@given(_refs, st.data())
def test_take_names_only_the_files_its_records_use_in_their_order(table, data):
    """`ChunkRefs.take(lo, hi)`: the records `lo..hi-1` as they were, over the files they use,
    numbered in the order of the full table's files (what `np.unique` gives), with each
    per-file column (names, shifts, ids, idents) cut to those files."""
    from aioloader.index.planning import ChunkRefs

    files, column, named, shifted = table
    n = len(column)
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    f = np.asarray(column, dtype=np.int64)
    ar = np.arange(n, dtype=np.int64)
    refs = ChunkRefs([f"p{k}" for k in range(files)], f, ar, 10 * ar, 10 * ar + 5, ar % 3,
                     [f"n{k}" for k in range(files)] if named else None,
                     [100 * k for k in range(files)] if shifted else None,
                     ar % 4 + 1, np.arange(files, dtype=np.int64) + 7,
                     [(k, k) for k in range(files)] if shifted else None, ar % 2)
    got = refs.take(lo, hi)
    used = sorted(set(column[lo:hi]))
    assert got.paths == [f"p{k}" for k in used]
    assert [got.paths[i] for i in got.file.tolist()] == [f"p{k}" for k in column[lo:hi]]
    assert got.file.dtype == np.int64
    for name in ("chunk", "start", "end", "within", "count", "format"):
        assert getattr(got, name).tolist() == getattr(refs, name)[lo:hi].tolist()
    assert got.names == ([f"n{k}" for k in used] if named else None)
    assert got.shift == ([100 * k for k in used] if shifted else None)
    assert got.idents == ([(k, k) for k in used] if shifted else None)
    assert got.ids is not None and got.ids.tolist() == [k + 7 for k in used]
