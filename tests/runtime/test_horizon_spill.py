"""An exact shuffle over large chunks with more than one horizon an epoch spills each chunk's
decoded records once (`workers.spill`, `runtime.horizons`): the batches are those of a loader
without the spill, whatever the workers or executor, and resume exactly; each chunk is
decoded about once per loader instead of once per horizon; the spill leaves no file; the
warning and stats() say whether it is on; where it is off or refused, chunks are decoded per
horizon as before (`tests/workers/test_spill.py`: a refused write; `tests/workers/test_ray.py`:
a Ray loader, whose actors never spill); the pool stops before the spill closes."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest

import aioloader as al

from .test_chunk_horizon import _write

BUDGET = 400_000  # the cache of a loader's half holds about one of the 6 chunks


@pytest.fixture
def small_chunks_count_as_large(monkeypatch):
    from aioloader.runtime import stashchoice

    monkeypatch.setattr(stashchoice, "LARGE_CHUNK", 1)  # the test files' chunks are ~80 KB


def _run(ds, **options) -> tuple[str, dict, int]:
    """The sha256 over the batches, the cache figures, and the chunks decoded."""
    h = hashlib.sha256()
    with ds.loader(memory_budget=BUDGET, **options) as loader:
        for batch in loader:
            for r in batch:
                h.update(len(r).to_bytes(4, "little") + r)
        return (h.hexdigest(), loader.stats().as_dict()["cache"],
                loader._parts.runner.chunks_decoded)


@pytest.mark.parametrize("workers, executor", [(0, "processes"), (1, "processes"),
                                               (2, "processes"), (2, "threads")])
def test_the_spill_gives_the_batches_of_no_spill_decoding_each_chunk_about_once(
        tmp_path, workers, executor, small_chunks_count_as_large):
    path = _write(tmp_path)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    ds = al.Dataset.from_arrayrecord(path).shuffle(7).repeat(3).batch(64)
    off, off_figures, off_decoded = _run(ds, workers=0, spill_bytes=0)
    assert off_figures["horizons_per_epoch"] >= 2 and "spill_bytes" not in off_figures
    got, figures, decoded = _run(ds, workers=workers, executor=executor,
                                 spill_dir=str(spill_dir))
    assert got == off
    assert figures["spill_bytes"] > 3000 * 150  # every chunk's records
    # 6 chunks decoded once each (and the odd record a task pulls out alone), not once
    # per horizon: the later horizons' fills read the spill
    assert figures["spill_hits"] >= 6 * (figures["horizons"] - 1) - 6
    assert decoded < off_decoded / 3
    assert os.listdir(spill_dir) == [] and not _held_in(spill_dir)  # (closed: let go)


def _held_in(where) -> list[str]:
    """This process's descriptors of files in `where` (named or not)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(where) + "/"):
            out.append(target)
    return out


def test_a_spilled_loader_resumes_exactly_mid_epoch(tmp_path, small_chunks_count_as_large):
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(2).repeat(2).batch(64)
    want = [bytes(b"".join(b)) for b in ds.loader(workers=0, memory_budget=BUDGET,
                                                   spill_bytes=0)]
    head = []
    with ds.loader(workers=2, memory_budget=BUDGET) as loader:
        for b in loader:
            head.append(bytes(b"".join(b)))
            if len(head) == 60:  # (the second epoch: its fills read the spill)
                state = loader.get_state()
                assert loader.stats().as_dict()["cache"]["spill_hits"] > 0
                break
    rest = [bytes(b"".join(b)) for b in ds.loader(workers=2, memory_budget=BUDGET,
                                                   state=state)]
    assert head + rest == want


def test_the_warning_and_stats_say_whether_the_spill_is_on(tmp_path, caplog,
                                                           small_chunks_count_as_large):
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(5).repeat(2).batch(64)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    for options, said in (({}, "is on ("), ({"spill_bytes": 0}, "is off (spill_bytes=0)")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aioloader"), \
                ds.loader(workers=0, memory_budget=BUDGET, spill_dir=spill_dir,
                          **options) as loader:
            # (unnamed, held open; a fill job in flight opens it too)
            held = max(len(_held_in(spill_dir)) for _ in loader)
            text = str(loader.stats())
        assert (held > 0) == (not options) and not _held_in(spill_dir)
        told = [r.getMessage() for r in caplog.records if "horizons" in r.getMessage()]
        assert len(told) == 1 and said in told[0], told
        assert ("the spill holds" in text) == (not options), text


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_the_pool_stops_before_the_spill_closes(tmp_path, executor, monkeypatch,
                                                 small_chunks_count_as_large):
    """No fill job is left running when the spill lets its file go (its number, and its
    inode, may be another file's at once)."""
    path = _write(tmp_path)
    ds = al.Dataset.from_arrayrecord(path).shuffle(7).repeat(2).batch(64)
    pool_closed_then = []
    with ds.loader(workers=2, executor=executor, memory_budget=BUDGET) as loader:
        it = iter(loader)
        while loader._parts.runner is None or loader._parts.runner.horizons.spill is None:
            next(it)
        next(it)  # (fills in flight)
        parts = loader._parts
        spill, pool = parts.runner.horizons.spill, parts.pool
        close = spill.close

        def closing() -> None:
            pool_closed_then.append(pool._closed)
            close()

        monkeypatch.setattr(spill, "close", closing)
    assert pool_closed_then and pool_closed_then[0]


def test_the_spill_is_sized_by_the_chunks_of_the_loaders_own_positions(
        tmp_path, small_chunks_count_as_large):
    """A contiguous shard of half the file meets half its chunks: its spill takes their
    bytes, not the whole file's (each rank of a host its own share)."""
    from aioloader.workers.spill import region_bytes

    path = _write(tmp_path)
    whole = al.Dataset.from_arrayrecord(path)
    sizes = []
    for ds in (whole, whole.shard(0, 2, contiguous=True)):
        with ds.shuffle(7).batch(64).loader(workers=0, memory_budget=BUDGET) as loader:
            for _ in loader:
                if loader._parts.runner.horizons.spill is not None:
                    break
            spill = loader._parts.runner.horizons.spill
            assert spill is not None
            sizes.append(spill.max_bytes)
            ix = loader._parts.source.table.indices[0]
    assert sizes[0] == int(region_bytes(ix.chunk_records, ix.chunk_decoded_sizes).sum())
    assert sizes[1] < sizes[0] * 0.6
