"""The compact record table answers exactly as a straightforward table built from FileIndex.

`RecordTable` keeps one bounds array (chunk ends derived), no per-chunk file column and no
record table for group_size 1; the reference below is the plain layout it replaced: every
column concatenated from the files' indices. Both are asked the same questions for random
sets of files (any group sizes, empty files, mixes), built in memory and mapped from an
index cache entry.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioloader.arrayrecord import FileIndex
from aioloader.arrayrecord.index import compact_counts, compact_sizes
from aioloader.cache.index_cache import HEAD_BYTES, IndexCache
from aioloader.index.planning import cut_runs
from aioloader.io.storage import ObjectInfo
from aioloader.source.table import RecordTable


class Reference:
    """The plain table: every column of every chunk, concatenated."""

    def __init__(self, indices: list[FileIndex]) -> None:
        counts = [len(ix.chunk_offsets) for ix in indices]
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        recs = [np.asarray(ix.chunk_records, dtype=np.int64) for ix in indices]
        allrec = np.concatenate(recs) if recs else np.zeros(0, np.int64)
        self.record_starts = np.concatenate([[0], np.cumsum(allrec)]).astype(np.int64)
        self.file = np.repeat(np.arange(len(indices)), counts).astype(np.int64)
        self.offsets = np.concatenate(
            [np.asarray(ix.chunk_offsets, np.int64) for ix in indices] or [np.zeros(0)]
        ).astype(np.int64)
        self.ends = np.concatenate(
            [np.append(np.asarray(ix.chunk_offsets[1:], np.int64), ix.footer_offset)
             if len(ix.chunk_offsets) else np.zeros(0, np.int64) for ix in indices]
            or [np.zeros(0)]
        ).astype(np.int64)

    def chunks_of(self, idx):
        g = np.searchsorted(self.record_starts, idx, side="right") - 1
        return g, idx - self.record_starts[g]


@st.composite
def file_indices(draw) -> list[FileIndex]:
    out = []
    for _ in range(draw(st.integers(0, 5))):
        n = draw(st.integers(0, 12))
        group = draw(st.sampled_from([1, 1, 2, 7, None]))  # None: counts vary per chunk
        counts = (np.full(n, group, np.int64) if group else
                  np.array(draw(st.lists(st.integers(1, 5), min_size=n, max_size=n)),
                           np.int64))
        gaps = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
        sizes = np.maximum(np.array(gaps, np.int64), counts)
        bounds = 64 + np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        footer = int(bounds[-1])
        decoded = np.array(draw(st.lists(st.integers(0, 1 << 20), min_size=n, max_size=n)),
                           np.int64)
        ix = FileIndex(path=f"f{len(out)}", size=footer + (1 << 16), footer_offset=footer,
                       chunk_offsets=bounds[:-1].copy(), chunk_records=compact_counts(counts),
                       chunk_decoded_sizes=compact_sizes(decoded),
                       writer_options=f"group_size:{group or 3}")
        out.append(ix)
    return out


def _infos(indices):
    return [ObjectInfo(f"/data/f{k}", ix.size, "1") for k, ix in enumerate(indices)]


def _check(table: RecordTable, ref: Reference, draw_idx) -> None:
    n = int(ref.record_starts[-1])
    assert len(table) == n
    assert np.array_equal(table.chunk_starts, ref.record_starts)
    assert table.max_group_size == max(
        [int(np.max(ix.chunk_records)) for ix in table.indices if ix.num_chunks] + [1])
    for ix in table.indices:  # the files' own views agree with the table
        assert np.array_equal(ix.chunk_ends, np.append(ix.chunk_offsets[1:],
                                                       ix.footer_offset)[: ix.num_chunks])
    if n:
        idx = np.array(draw_idx(n), dtype=np.int64)
        g, within = ref.chunks_of(idx)
        files, chunks, w = table.locate(idx)
        assert np.array_equal(files, ref.file[g])
        assert np.array_equal(chunks, g - ref.first[ref.file[g]])
        assert np.array_equal(w, within)
        assert [table.locate_one(i) for i in idx.tolist()] == \
            list(zip(files.tolist(), chunks.tolist(), w.tolist()))
        refs = table.chunk_refs(idx)
        assert np.array_equal(refs.ids[refs.file], ref.file[g])
        assert np.array_equal(refs.chunk, g - ref.first[ref.file[g]])
        assert np.array_equal(refs.start, ref.offsets[g])
        assert np.array_equal(refs.end, ref.ends[g])
        assert np.array_equal(refs.within, within)
        assert np.array_equal(refs.count, ref.record_starts[g + 1] - ref.record_starts[g])
    for target in (1, 500, 5000, 1 << 30):
        want = cut_runs(ref.file, ref.offsets, ref.ends, target)
        got = table.runs(target)
        for field in ("chunk", "file", "start", "end"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), field
        assert np.array_equal(table.run_record_starts(target), ref.record_starts[want.chunk])


@settings(max_examples=150, deadline=None)
@given(indices=file_indices(), data=st.data())
def test_the_compact_table_answers_as_the_plain_one(indices, data):
    def draw_idx(n):
        return data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40))

    ref = Reference(indices)
    _check(RecordTable(_infos(indices), indices), ref, draw_idx)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(indices=file_indices(), data=st.data())
def test_a_table_mapped_from_the_index_cache_answers_alike(tmp_path, indices, data):
    def draw_idx(n):
        return data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40))

    cache = IndexCache(tmp_path / f"c{os.urandom(4).hex()}")
    infos = _infos(indices)
    cache.store(infos, indices, np.zeros((len(infos), HEAD_BYTES), dtype=np.uint8))
    cached = cache.load(infos)
    assert cached is not None
    table = RecordTable(infos, cached.indices, cached.bounds)
    assert table._chunks.shared
    _check(table, Reference(indices), draw_idx)


def test_group_size_1_keeps_about_12_bytes_a_record():
    n = 200_000
    offsets = 64 + 60 * np.arange(n, dtype=np.int64)
    ix = FileIndex(path="f", size=int(offsets[-1]) + (1 << 17), footer_offset=int(offsets[-1]) + 60,
                   chunk_offsets=offsets, chunk_records=compact_counts(np.ones(n, np.int64)),
                   chunk_decoded_sizes=compact_sizes(np.full(n, 8, np.int64)),
                   writer_options="group_size:1")
    table = RecordTable(_infos([ix]), [ix])
    kept = table._chunks.bounds.nbytes + sum(
        x.chunk_decoded_sizes.nbytes + (x.chunk_records.nbytes
                                        if x.chunk_records.strides != (0,) else 0)
        for x in table.indices)
    assert kept <= 12 * n + 64
    assert table._chunks.record_starts is None
    assert np.shares_memory(table.indices[0].chunk_offsets, table._chunks.bounds)
    assert np.shares_memory(table.indices[0].chunk_ends, table._chunks.bounds)


@settings(max_examples=150, deadline=None)
@given(indices=file_indices(), data=st.data())
def test_read_instruction_ranges_number_exactly_their_records(indices, data):
    """With `ranges` (read instructions), record i of the table is the i-th of the ranges'
    records in order, and every record boundary the table hands out (chunks, runs) holds
    exactly the numbered records of that chunk or run."""
    ranges = []
    for ix in indices:
        n = ix.num_records
        a = data.draw(st.integers(0, n))
        ranges.append(data.draw(st.sampled_from([None, (a, data.draw(st.integers(a, n)))])))
    table = RecordTable(_infos(indices), indices, ranges=ranges)
    want = [(f, r) for f, (ix, rng) in enumerate(zip(indices, ranges))
            for r in range(*(rng or (0, ix.num_records)))]
    assert len(table) == len(want)
    assert table.pattern_records == tuple(
        (rng[1] - rng[0]) if rng else ix.num_records for ix, rng in zip(indices, ranges))
    if not want:
        return
    idx = np.arange(len(want), dtype=np.int64)
    files, chunks, within = table.locate(idx)
    record = [int(table.indices[f].record_starts[c]) + w
              for f, c, w in zip(files.tolist(), chunks.tolist(), within.tolist())]
    assert list(zip(files.tolist(), record)) == want
    assert [table.locate_one(i) for i in idx.tolist()] == \
        list(zip(files.tolist(), chunks.tolist(), within.tolist()))
    first = np.concatenate([[0], np.cumsum([ix.num_chunks for ix in indices])])
    g = first[files] + chunks  # each record's chunk among all chunks
    cs = table.chunk_starts
    assert cs[0] == 0 and cs[-1] == len(want) and np.all(np.diff(cs) >= 0)
    assert np.all((cs[g] <= idx) & (idx < cs[g + 1]))
    for target in (1, 5000):
        rs, run_chunk = table.run_record_starts(target), table.runs(target).chunk
        run = np.searchsorted(run_chunk, g, side="right") - 1
        assert rs[-1] == len(want) and np.all((rs[run] <= idx) & (idx < rs[run + 1]))


def test_a_range_past_the_end_of_its_file_is_refused():
    ix = FileIndex(path="f", size=1 << 17, footer_offset=164, chunk_offsets=np.array([64, 114]),
                   chunk_records=compact_counts(np.array([1, 1])),
                   chunk_decoded_sizes=compact_sizes(np.array([8, 8])),
                   writer_options="group_size:1")
    with pytest.raises(ValueError, match=r"/data/f0\[1:3\].*holds 2"):
        RecordTable(_infos([ix]), [ix], ranges=[(1, 3)])
