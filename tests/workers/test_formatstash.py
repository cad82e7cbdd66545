"""Parquet rows through the stash the workers share (`workers.formatstash`): under an exact
shuffle with several workers each row group is decoded once per horizon, by one worker, and
every task reads its rows there; the batches are the ones `workers=0` gives without a stash
(threads and processes alike), a resume from a state taken on that path is bit for bit, a
stash too small for a horizon's rows leaves the rest to the tasks (same batches), and a
block shuffle or a sequential read do not take it."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import aioloader as al
from aioloader.index.chunkaccess import everywhere, tasks_per_chunk
from aioloader.index.planning import ChunkRefs
from aioloader.workers.extract import lay_out, read_entry
from aioloader.workers.formatstash import HEAD_RECORD, lay_out_each

from ..support.parquet_files import damaged_row_group

ROWS, FILES, GROUP = 400, 4, 50


@pytest.fixture(scope="module")
def glob(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("pqstash")
    for k in range(FILES):
        ids = np.arange(k * ROWS, (k + 1) * ROWS)
        pq.write_table(pa.table({
            "id": pa.array(ids),
            "text": [f"row {i} " + "x" * (300 + i % 37) for i in ids],
            "score": pa.array(ids * 0.5, type=pa.float32()),
        }), root / f"p{k}.parquet", row_group_size=GROUP)
    return str(root / "p*.parquet")


@pytest.fixture
def row_groups_count_as_large(monkeypatch):
    from aioloader.runtime import stashchoice

    monkeypatch.setattr(stashchoice, "LARGE_CHUNK", 1)  # the test files' row groups are small


def _digest(batches) -> str:
    h = hashlib.sha256()
    for b in batches:
        for k in sorted(b):
            v = b[k]
            h.update(k.encode())
            h.update(repr(v.tolist() if hasattr(v, "tolist") else v).encode())
    return h.hexdigest()


def _run(ds: al.Dataset, **options) -> tuple[str, int, int]:
    """The batches' digest, the horizons filled and the chunks the workers decoded."""
    return _runs(ds, **options)[:3]


def _runs(ds: al.Dataset, **options) -> tuple[str, int, int, int]:
    """`_run`'s, and the records the tasks decoded because their horizon lacked them."""
    with ds.loader(**options) as it:
        got = list(it)
        runner = it._parts.runner
        return (_digest(got), runner.horizons.count, runner.chunks_decoded,
                runner.stash_missed)


def _exact(glob: str) -> al.Dataset:
    return al.Dataset.from_parquet(glob).shuffle(seed=5).repeat(2).batch(32)


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_an_exact_shuffle_with_workers_shares_each_row_groups_decode(
        glob, executor, row_groups_count_as_large):
    ds = _exact(glob)
    want, none, _ = _run(ds, workers=0)
    assert none == 0  # one decoding process: its kept row groups serve
    got, filled, decoded = _run(ds, workers=2, executor=executor)
    assert got == want
    assert filled > 0
    # each row group decoded once per horizon, not once per worker
    assert decoded <= filled * FILES * ROWS // GROUP


def test_a_resume_from_the_stash_path_is_bit_for_bit(glob, row_groups_count_as_large):
    ds = _exact(glob)
    want, _, _ = _run(ds, workers=0)
    head = []
    with ds.loader(workers=2) as it:
        for b in it:
            head.append(b)
            if len(head) == 7:
                state = it.get_state()
                break
        assert it._parts.runner.horizons.count > 0
    with ds.loader(workers=2, state=state) as it:
        rest = list(it)
    assert _digest(head + rest) == want


def test_a_stash_too_small_for_the_horizon_leaves_the_rest_to_the_tasks(
        glob, row_groups_count_as_large):
    ds = _exact(glob)
    want, _, _ = _run(ds, workers=0)
    got, filled, _, missed = _runs(ds, workers=2, memory_budget=100_000)
    assert got == want and filled > 0
    assert missed > 0  # (rows its regions had no room for: decoded by their tasks)
    got, filled, _, missed = _runs(ds, workers=2)
    assert got == want and filled > 0 and missed == 0  # (room for all: none left over)


def test_row_groups_a_process_cannot_keep_go_through_the_stash_with_one_worker_too(
        glob, row_groups_count_as_large):
    """A quarter of this budget does not hold the row groups an exact shuffle's tasks all
    want: each task would decode most of them again; the stash decodes each once."""
    ds = _exact(glob)
    want, _, _ = _run(ds, workers=0)
    got, filled, decoded = _run(ds, workers=0, memory_budget=300_000)
    assert got == want and filled > 0
    assert decoded <= 2 * filled * FILES * ROWS // GROUP


def test_a_sequential_read_decodes_row_groups_in_the_tasks(glob, row_groups_count_as_large):
    ds = al.Dataset.from_parquet(glob).batch(32)
    want, _, _ = _run(ds, workers=0)
    got, filled, _ = _run(ds, workers=2)
    assert got == want and filled == 0


def test_a_block_shuffle_gives_the_same_batches_whatever_the_workers(
        glob, row_groups_count_as_large, caplog):
    """A block shuffle's window that fits what a process keeps: each task decodes its own
    row groups (kept by its process), with no horizon to wait for. One that does not fit
    (a small budget) is filled into the stash as an exact shuffle is: each row group
    decoded once a horizon, not once a task. The batches are the same either way."""
    ds = al.Dataset.from_parquet(glob).shuffle(seed=1, strategy="block", block_bytes=20_000,
                                                window_bytes=60_000).batch(32)
    want, filled, _ = _run(ds, workers=0)
    assert filled == 0
    assert _run(ds, workers=2)[0] == want  # (these few rows are all met at once: shared)
    for workers in (0, 2):
        caplog.clear()
        got, filled, _ = _run(ds, workers=workers, memory_budget=300_000)
        assert got == want and filled > 0, workers
        # (several horizons: the warning names the block shuffle, and what to change)
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "block shuffle over large chunks" in said and "window_bytes" in said
        assert "spill_bytes) is off: it keeps decoded ArrayRecord chunks only" in said
    with ds.loader(workers=0, memory_budget=300_000) as it:  # the stats line says it too
        list(it)
        table = str(it.stats())
    line = next(ln for ln in table.splitlines() if "over large chunks" in ln)
    assert line.startswith("block shuffle over large chunks") and "window_bytes" in line
    assert "strategy" not in line  # (it had said "exact shuffle ... or use a block shuffle")


@pytest.mark.parametrize("budget", [120_000, 400_000])
def test_a_read_in_order_decodes_its_own_row_groups_whatever_the_budget(
        glob, row_groups_count_as_large, budget):
    """A read in order wants each row group for a few tasks one after another: the ones a
    process keeps serve them, with no horizon to fill, even where a row group is larger
    than what a process keeps."""
    ds = al.Dataset.from_parquet(glob).batch(32)
    want, filled, _ = _run(ds, workers=0)
    got, filled, _ = _run(ds, workers=2, memory_budget=budget)
    assert got == want and filled == 0


def _refs(keys: list[tuple[int, int]]) -> ChunkRefs:
    file = np.array([f for f, _ in keys], dtype=np.int64)
    start = np.array([s for _, s in keys], dtype=np.int64)
    n = len(keys)
    return ChunkRefs(paths=["a", "b", "c"], file=file, chunk=start, start=start, end=start + 1,
                     within=np.zeros(n, dtype=np.int64), count=np.full(n, 100, np.int64))


def test_tasks_per_chunk_tells_an_exact_shuffle_from_a_sequential_read():
    rng = np.random.default_rng(0)
    keys = [(f, s) for f in range(3) for s in range(10) for _ in range(100)]  # 30 chunks
    sequential = _refs(keys)
    shuffled = _refs([keys[i] for i in rng.permutation(len(keys))])
    assert tasks_per_chunk(shuffled, 300) > 0.9  # every task wants nearly every chunk
    assert tasks_per_chunk(sequential, 300) < 0.2  # a chunk is one task's or two
    one_record = _refs(keys)
    one_record.count[:] = 1
    assert tasks_per_chunk(one_record, 300) == 0.0


def test_an_entry_laid_out_reads_back_and_keeps_the_prefix_that_fits():
    records = [bytes([k]) * (k * 7) for k in range(20)]
    wanted = np.arange(3, 23, dtype=np.int64)
    region = bytearray(10_000)
    got, _offs, _data = lay_out(records, wanted, into=memoryview(region))
    assert got.tolist() == wanted.tolist()
    have, offs2, data2 = read_entry(memoryview(region))
    assert have.tolist() == wanted.tolist()
    assert [bytes(data2[a:b]) for a, b in itertools.pairwise(offs2)] == records
    small = bytearray(400)
    got, _, _ = lay_out(records, wanted, into=memoryview(small))
    have, offs3, data3 = read_entry(memoryview(small))
    assert 0 < len(have) < len(records) and have.tolist() == wanted[: len(have)].tolist()
    assert [bytes(data3[a:b]) for a, b in itertools.pairwise(offs3)] == records[: len(have)]


def test_a_fill_lays_out_rows_one_at_a_time_and_makes_none_past_the_first_that_misses():
    """The head once, then rows as they come, up to the first that does not fit: the rows
    after it are never made (a fill holds no more than its region)."""
    made = []

    def rows():
        for k in range(1000):
            made.append(k)
            yield bytes([k % 256]) * 50

    wanted = np.arange(1000, dtype=np.int64) * 3
    region = memoryview(bytearray(2_000))
    n = lay_out_each(b"schema", rows(), wanted, region)
    assert 0 < n < 30 and len(made) == n + 1
    have, offs, data = read_entry(region)
    assert have.tolist() == [HEAD_RECORD, *wanted[:n].tolist()]
    got = [bytes(data[a:b]) for a, b in itertools.pairwise(offs)]
    assert got[0] == b"schema" and got[1:] == [bytes([k]) * 50 for k in range(n)]
    assert lay_out_each(b"x" * 5000, rows(), wanted, region) == 0
    assert read_entry(region)[0].tolist() == []


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_row_group_met_by_a_fill_job_names_the_file_and_row_group(
        tmp_path, workers, row_groups_count_as_large):
    """A fill job that cannot decode its row group fails the horizon: every task waiting on
    it gets the file's error (no hang, no rows made up)."""
    path = tmp_path / "bad.parquet"
    damaged_row_group(path, 20)
    ds = al.Dataset.from_parquet(str(path)).shuffle(seed=0).batch(16)
    with pytest.raises(al.ParquetFormatError, match=r"bad\.parquet, row group 1"):
        # (a budget whose kept quarter cannot hold the row groups: the stash at workers=0)
        list(ds.loader(workers=workers, memory_budget=200_000))


def test_everywhere_tells_an_exact_shuffle_from_a_block_shuffle_and_a_sequential_read():
    rng = np.random.default_rng(1)
    keys = [(f, s) for f in range(3) for s in range(10) for _ in range(100)]  # 30 chunks
    exact = _refs([keys[i] for i in rng.permutation(len(keys))])
    windows = [rng.permutation(np.arange(w, w + 300)) for w in range(0, len(keys), 300)]
    block = _refs([keys[i] for w in rng.permutation(len(windows)) for i in windows[w]])
    assert everywhere(exact, 300, 30)
    assert not everywhere(_refs(keys[:1500]), 300, 30)  # a sequential read
    # a block shuffle's first windows: every task wants their few chunks, not most chunks
    assert not everywhere(_refs([keys[i] for w in windows[:4] for i in w]), 300, 30)
    assert tasks_per_chunk(block, 300) < 0.5  # windows of 3 chunks: a task or two each
