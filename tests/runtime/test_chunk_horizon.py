"""Large chunks under an exact shuffle: records pulled out per horizon into the workers'
shared stash (`workers.extract`, `planning.ChunkWants`, `runtime.horizons`) are the records,
in any order, with any stash size; a loader that takes that path gives the batches of one
that decodes chunks whole, whatever its worker count, decodes each chunk once per horizon
(not once per worker), and resumes exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.arrayrecord import ArrayRecordFormatError
from aioloader.arrayrecord.index import read_index
from aioloader.index.planning import ChunkRefs, chunk_wants
from aioloader.workers import extract as extract_mod
from aioloader.workers.decode import Decoder
from aioloader.workers.extract import StashFile, extract, read_entry
from aioloader.workers.messages import Fill, StashRef

_FILES: dict[tuple, tuple] = {}


def _records(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, 50, 300, 3000, 70_000]
    return [(rng.randbytes(8) + b"text " * 20_000)[: rng.choice(sizes)] for _ in range(n)]


def _file(tmp_root, options: str, n: int = 600, seed: int = 1):
    """A written file, its records and source (made once per options: hypothesis reuses)."""
    key = (options, n, seed)
    if key not in _FILES:
        path = tmp_root / f"f-{len(_FILES)}.array_record"
        records = _records(n, seed)
        with al.ArrayRecordWriter(path, options=options) as w:
            for r in records:
                w.write(r)
        data = path.read_bytes()
        ix = read_index(len(data), lambda o, k: data[o : o + k], path=str(path))
        _FILES[key] = (str(path), records, _Table(str(path), ix))
    return _FILES[key]


class _Table:
    """Records -> chunk refs of one file (what the source's table does, without opening
    a source: no threads for the leak check to find)."""

    def __init__(self, path: str, ix) -> None:
        self.path, self.ix = path, ix
        self.table = self

    def chunk_refs(self, records) -> ChunkRefs:
        ix, idx = self.ix, np.asarray(records, dtype=np.int64)
        chunk = np.searchsorted(ix.record_starts, idx, side="right") - 1
        return ChunkRefs([self.path], np.zeros(len(idx), np.int64), chunk,
                         ix.chunk_offsets[chunk], ix.chunk_ends[chunk],
                         idx - ix.record_starts[chunk], count=ix.chunk_records[chunk])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("horizon")


def _chunk_of(src, record: int) -> tuple[bytes, int, int, int]:
    refs = src.table.chunk_refs(np.array([record]))
    s, e = int(refs.start[0]), int(refs.end[0])
    with open(refs.paths[0], "rb") as f:
        f.seek(s)
        return f.read(e - s), s, int(refs.count[0]), int(refs.within[0])


@settings(max_examples=40, deadline=None)
@given(options=st.sampled_from(["group_size:200,zstd:3", "group_size:200,uncompressed",
                                "group_size:200,brotli:3", "group_size:1000,zstd:1"]),
       piece=st.sampled_from([64, 4096, 1 << 20]), data=st.data())
def test_extract_gives_the_wanted_records_of_any_chunk(root, options, piece, data):
    path, records, src = _file(root, options)
    record = data.draw(st.integers(0, len(records) - 1))
    raw, start, count, within = _chunk_of(src, record)
    first = record - within
    wanted = np.array(sorted(set(data.draw(st.lists(st.integers(0, count - 1),
                                                     max_size=60)))), dtype=np.int64)
    old = extract_mod.PIECE
    extract_mod.PIECE = piece  # small pieces: records that span several of them
    try:
        got, offs, blob = extract(raw, start, wanted, verify="all", path=path,
                                  expected_records=count)
    finally:
        extract_mod.PIECE = old
    assert got is wanted
    assert [blob[offs[k] : offs[k + 1]] for k in range(len(wanted))] == \
        [records[first + int(w)] for w in wanted]


def test_extract_refuses_a_chunk_larger_than_the_budget_before_decoding(root):
    path, _records, src = _file(root, "group_size:200,zstd:3")
    raw, start, count, _ = _chunk_of(src, 0)
    with pytest.raises(ArrayRecordFormatError, match="memory budget"):
        extract(raw, start, np.array([0]), path=path, expected_records=count,
                max_decoded=1000)


def test_extract_names_the_file_of_a_truncated_stream(root):
    path, _records, src = _file(root, "group_size:1000,zstd:1")
    raw, start, count, _ = _chunk_of(src, 0)
    cut = bytearray(raw)
    cut[len(raw) // 2 :] = bytes(len(raw) - len(raw) // 2)  # the stream's second half zeroed
    with pytest.raises(ArrayRecordFormatError, match=path):
        extract(bytes(cut), start, np.array([count - 1]), path=path, expected_records=count,
                verify="headers")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 400), files=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_chunk_wants_lists_each_chunks_wanted_records_once_in_order(n, files, seed):
    rng = np.random.default_rng(seed)
    file = rng.integers(0, files, n)
    start = rng.integers(0, 4, n) * 100
    count = 5 + start // 100  # chunks of 5..8 records; a few of 1
    count[rng.random(n) < 0.1] = 1
    within = rng.integers(0, 5, n) % count
    refs = ChunkRefs([f"p{i}" for i in range(files)], file, np.zeros(n, np.int64), start,
                     start + 50, within, count=count)
    wants = chunk_wants(refs, 7)
    assert wants.horizon == 7
    for f in range(files):
        for s in range(0, 400, 100):
            here = (file == f) & (start == s) & (count > 1)
            assert wants.of(f"p{f}", s).tolist() == sorted(set(within[here].tolist()))
    assert wants.of("elsewhere", 0).tolist() == []


@settings(max_examples=25, deadline=None)
@given(tasks=st.lists(st.lists(st.integers(0, 599), max_size=40), min_size=1, max_size=6),
       stash=st.sampled_from([256, 2000, 40_000, 1 << 20]), seed=st.integers(0, 100))
def test_tasks_over_a_filled_stash_give_the_records_of_a_decoder_without(root, tasks, stash,
                                                                         seed):
    _path, records, src = _file(root, "group_size:200,zstd:3")
    rng = np.random.default_rng(seed)
    ahead = rng.integers(0, len(records), 300)  # what the rest of the horizon wants
    wanted = np.concatenate([np.asarray(t, dtype=np.int64) for t in tasks] + [ahead])
    refs = src.table.chunk_refs(wanted)
    wants = chunk_wants(refs, 0)
    file = StashFile(stash)
    dec = Decoder(0)
    try:
        offsets, sizes = file.regions(np.diff(wants.offsets) * 400.0)
        assert sizes.sum() <= stash and (offsets % 64 == 0).all()
        at = {}
        for c in range(len(sizes)):  # the fill jobs (any worker's: one decoder will do)
            i = int(wants.first[c])
            job = Fill(file.path, int(offsets[c]), int(sizes[c]),
                       wants.within[wants.offsets[c] : wants.offsets[c + 1]])
            if dec.fill(refs.take(i, i + 1), None, job):
                at[(wants.names[int(wants.file[c])], int(wants.start[c]))] = (
                    int(offsets[c]), int(sizes[c]))
        ref = StashRef(file.path, 0, at)
        for task in tasks:
            idx = np.asarray(task, dtype=np.int64)
            assert dec.records(src.table.chunk_refs(idx), None, stash=ref) == \
                [records[i] for i in task]
    finally:
        dec.close()
        file.close()


def test_a_region_too_small_keeps_the_records_that_fit_in_order(root):
    path, records, src = _file(root, "group_size:200,zstd:3")
    raw, start, count, _ = _chunk_of(src, 0)
    wanted = np.arange(0, 200, 3, dtype=np.int64)
    region = memoryview(bytearray(4096))
    got = extract(raw, start, wanted, path=path, expected_records=count, into=region)[0]
    assert 0 < len(got) < len(wanted) and (got == wanted[: len(got)]).all()
    entry = read_entry(region)
    assert entry[0].tolist() == got.tolist()
    assert [bytes(entry[2][a:b]) for a, b in zip(entry[1][:-1], entry[1][1:])] == \
        [records[int(w)] for w in got]
    assert extract(raw, start, wanted, path=path, expected_records=count,
                   into=memoryview(bytearray(24)))[0].tolist() == []


def _write(tmp_path, n: int = 3000, group: int = 500) -> str:
    path = tmp_path / "big.array_record"
    with al.ArrayRecordWriter(path, group_size=group) as w:
        for i in range(n):
            w.write(b"%d:" % i + b"x" * (i % 300))
    return str(path)


def _ids(batch) -> list[int]:
    return [int(r.split(b":")[0]) for r in batch]


@pytest.fixture
def small_chunks_count_as_large(monkeypatch):
    from aioloader.runtime import stashchoice

    monkeypatch.setattr(stashchoice, "LARGE_CHUNK", 1)  # the test files' chunks are ~80 KB


@pytest.mark.parametrize("workers, executor", [(0, "processes"), (2, "processes"),
                                               (2, "threads")])
def test_an_exact_shuffle_over_more_chunks_than_the_cache_takes_the_horizon_path(
        tmp_path, workers, executor, small_chunks_count_as_large):
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(3).repeat(2).batch(64)
    # The cache holds all 6 chunks (~0.5 MB decoded): whole chunks decoded and cached.
    want = [_ids(b) for b in ds.loader(workers=0)]
    assert sorted(i for b in want for i in b) == sorted(list(range(3000)) * 2)
    # A budget whose cache share holds one chunk: records pulled out per horizon.
    assert _on_horizons_then_resumed(ds, 41, workers=workers, executor=executor) == want


def _on_horizons_then_resumed(ds, k: int, **options) -> list[list[int]]:
    """`k` batches from a loader that must take the horizon path, then the rest from a
    loader resumed from its state."""
    options["memory_budget"] = 400_000
    head = []
    with ds.loader(**options) as loader:
        for b in loader:
            head.append(_ids(b))
            if len(head) == k:
                state = loader.get_state()
                break
        # (not the latest horizon's future: leaving the loop may cancel one in the works)
        assert loader._parts.runner.horizons.count > 0
    return head + [_ids(b) for b in ds.loader(**options, state=state)]


def test_a_block_shuffle_and_a_sequential_read_keep_decoding_whole_chunks(
        tmp_path, small_chunks_count_as_large):
    path = _write(tmp_path)
    for ds in (al.Dataset.from_arrayrecord(path).batch(64),
               al.Dataset.from_arrayrecord(path).shuffle(
                   1, strategy="block", block_bytes=4096, window_bytes=60_000).batch(64)):
        with ds.loader(workers=0, memory_budget=400_000) as loader:
            ids = [i for b in loader for i in _ids(b)]
            h = loader._parts.runner.horizons
            assert h.probed > 0 and h.count == 0
        assert sorted(ids) == list(range(3000))


@pytest.mark.parametrize("workers", [1, 2])
def test_each_chunk_is_decoded_once_per_horizon_whatever_the_worker_count(
        tmp_path, workers, small_chunks_count_as_large):
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(5).batch(64)
    with ds.loader(workers=workers, memory_budget=400_000) as loader:
        ids = [i for b in loader for i in _ids(b)]
        runner = loader._parts.runner
        # 6 chunks, each pulled out once per horizon by one worker (a record of a task
        # that straddles a horizon's region may be pulled out again, for it alone)
        assert runner.horizons.count >= 2
        assert runner.chunks_decoded <= 6 * runner.horizons.count + 6
    assert sorted(ids) == list(range(3000))


def test_small_chunks_are_decoded_by_each_task_as_before(tmp_path):
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(3).batch(64)
    with ds.loader(workers=0, memory_budget=400_000) as loader:
        ids = [i for b in loader for i in _ids(b)]
        assert loader._parts.runner.horizons.probed == 0  # never worked out
    assert sorted(ids) == list(range(3000))


@pytest.mark.parametrize("workers, executor", [(0, "processes"), (2, "processes"),
                                               (2, "threads")])
def test_the_horizon_path_from_a_bucket_gives_the_local_batches(
        tmp_path, workers, executor, small_chunks_count_as_large):
    """Chunks fetched from gs:// (raw bytes in the fetch stage's cache, handed to the fill
    jobs and the tasks as refs, not file paths) give the same batches, and resume."""
    from aioloader.testing import local_gcs

    path = _write(tmp_path)
    local = al.Dataset.from_arrayrecord(path).shuffle(3).batch(64)
    want = [_ids(b) for b in local.loader(workers=0)]
    with local_gcs() as gcs:
        url = gcs.upload(path, "h/big.array_record")
        ds = al.Dataset.from_arrayrecord(url, storage_options=gcs.storage_options) \
            .shuffle(3).batch(64)
        got = _on_horizons_then_resumed(ds, 21, workers=workers, executor=executor,
                                        resident_bytes=0)
    assert got == want


@pytest.mark.parametrize("workers, executor", [(0, "processes"), (1, "processes"),
                                               (2, "processes"), (2, "threads")])
def test_chunks_each_worker_cannot_hold_are_decoded_about_once_an_epoch(
        tmp_path, workers, executor, small_chunks_count_as_large):
    """The cache of all workers holds the 6 chunks (~0.6 MB cached) but each of 2 workers'
    shares does not: the decision follows what one decoding process holds, so 2 workers
    decode no more chunks an epoch than a small multiple of the chunk count, as 0 do
    (never one per task), and give the same batches."""
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(4).repeat(2).batch(32)
    want = [_ids(b) for b in ds.loader(workers=0)]
    with ds.loader(workers=workers, executor=executor, memory_budget=1_400_000) as loader:
        got = [_ids(b) for b in loader]
        decoded = loader._parts.runner.chunks_decoded
    assert decoded <= 3 * 6 * 2  # (6 chunks, 2 epochs; one per task: ~90)
    assert got == want


def test_a_block_shuffle_whose_window_fits_one_workers_cache_keeps_whole_chunks(
        tmp_path, small_chunks_count_as_large):
    """Windows of one chunk, read one after the other: each of 2 workers' shares holds a
    window's chunk, though not the two chunks that a horizon's first positions touch."""
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(
        1, strategy="block", block_bytes=1, window_bytes=1).batch(64)
    want = [_ids(b) for b in ds.loader(workers=0)]
    with ds.loader(workers=2, memory_budget=440_000) as loader:
        got = [_ids(b) for b in loader]
        h = loader._parts.runner.horizons
        assert h.probed > 0 and h.count == 0
    assert got == want


def test_thrashes_asks_whether_a_chunk_would_be_decoded_again(root):
    """Chunks of 200 records: three wanted together by every task thrash a cache of two,
    not one of three; wanted one after the other, they fit a cache of one."""
    from aioloader.index.chunkaccess import thrashes

    _path, _records, src = _file(root, "group_size:200,zstd:3")
    mixed = src.chunk_refs(np.random.default_rng(0).permutation(600))
    one_by_one = src.chunk_refs(np.arange(600))
    assert thrashes(mixed, 2 * 200, 1.0, 100)
    assert not thrashes(mixed, 3 * 200, 1.0, 100)
    assert not thrashes(one_by_one, 200, 1.0, 100)
    assert thrashes(one_by_one, 199, 1.0, 100)  # a chunk larger than the cache


def test_an_epoch_of_several_horizons_is_told_once_naming_memory_budget(
        tmp_path, caplog, small_chunks_count_as_large):
    """Each chunk is decoded once per horizon, so an epoch of more records than half of
    memory_budget holds costs more CPU a record: said once (a warning naming the setting
    and a budget that makes one horizon), and in stats(); that budget gives one horizon
    and the same batches."""
    import logging

    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(5).repeat(2).batch(64)
    with caplog.at_level(logging.WARNING, logger="aioloader"), \
            ds.loader(workers=0, memory_budget=400_000) as loader:
        want = [_ids(b) for b in loader]
        figures = loader.stats().as_dict()["cache"]
        text = str(loader.stats())
    told = [r.getMessage() for r in caplog.records if "horizons" in r.getMessage()]
    assert len(told) == 1, told
    assert "memory_budget" in told[0] and 'strategy="block"' in told[0]
    assert figures["horizons_per_epoch"] >= 2
    assert figures["horizons"] >= 2 * figures["horizons_per_epoch"] - 1  # two epochs
    assert "raise memory_budget" in text
    suggested = int(float(told[0].split("raise memory_budget to about ")[1].split(" MB")[0])
                    * 1e6)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aioloader"), \
            ds.loader(workers=0, memory_budget=suggested) as loader:
        got = [_ids(b) for b in loader]
        again = loader.stats().as_dict()["cache"]
    assert again.get("horizons_per_epoch", 1) == 1
    assert not [r for r in caplog.records if "horizons" in r.getMessage()]
    assert got == want


def test_the_horizons_an_epoch_needs_count_this_loaders_positions(
        tmp_path, caplog, small_chunks_count_as_large):
    """Under shard() (or a slice) an epoch is this loader's positions, not every record in
    the files: the warning, its suggested budget and stats() count those."""
    import logging
    import math

    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(5).shard(0, 4).repeat(2).batch(64)
    with caplog.at_level(logging.WARNING, logger="aioloader"), \
            ds.loader(workers=0, memory_budget=400_000) as loader:
        got = sum(len(b) for b in loader)
        figures = loader.stats().as_dict()["cache"]
    told = [r.getMessage() for r in caplog.records if "horizons" in r.getMessage()]
    assert got == 2 * 750
    assert len(told) == 1 and "an epoch of 750 records" in told[0], told
    assert figures["horizons_per_epoch"] == math.ceil(750 / figures["horizon_records"]) == 2
    assert figures["horizons"] == math.ceil(2 * 750 / figures["horizon_records"])


def test_an_epoch_is_the_positions_one_pass_of_the_loader_gives():
    from aioloader.index.indexplan import IndexPlan
    from aioloader.index.sampling import Repeat, Shard, Shuffle, Slice
    from aioloader.runtime.horizons import epoch_positions

    def epoch(*ops) -> int:
        return epoch_positions(IndexPlan(3000, ops), 3000)

    assert epoch(Shuffle(5)) == 3000
    assert epoch(Shuffle(5), Shard(0, 4)) == epoch(Shuffle(5), Shard(0, 4), Repeat(2)) == 750
    assert epoch(Slice(None, 500), Shuffle(5), Repeat()) == 500
    assert epoch(Repeat(3), Shard(1, 4)) == 750  # a shard of each epoch
    assert epoch(Shard(0, 3), Repeat(2), Shuffle(1)) == 1000  # epochs mixed: the repeated


async def test_a_horizon_holds_a_task_only_where_every_chunk_it_meets_went_in_whole():
    """A task is sent without its bytes only if each of its records lies in a chunk whose
    wanted records all went into the stash (a region that ran out of room holds a prefix)."""
    from aioloader.runtime.horizons import Horizon

    def refs(keys, count=100):
        f = np.array([k[0] for k in keys], np.int64)
        s = np.array([k[1] for k in keys], np.int64)
        return ChunkRefs(paths=["a", "b"], file=f, chunk=s, start=s, end=s + 1,
                         within=np.arange(len(keys), dtype=np.int64),
                         count=np.full(len(keys), count, np.int64))

    h = Horizon((0, 0), None)
    assert not h.holds(refs([(0, 0)]))  # (nothing filled yet)
    h.full = {("a", 0), ("b", 10)}
    assert h.holds(refs([(0, 0), (1, 10), (0, 0)]))
    assert not h.holds(refs([(0, 0), (1, 20)]))  # (a chunk that went in a prefix only)
    assert not h.holds(refs([(0, 0)], count=1))  # (one-record chunks are never stashed)
    assert not h.holds(refs([]))
