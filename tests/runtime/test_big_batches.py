"""Batches larger than a shared-memory slot: they still come back through shared memory
(the arena grows), equal to workers=0 byte for byte, in bounded memory."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time

import numpy as np
import pytest

import aioloader as al

from ..support import pipeline_fns as fns
from ..support.arrayrecord_util import write_noise

RECORD = 16 << 10  # 16 KiB records, batches of 16: 256 KiB, four times a 64 KiB slot
SLOT = 64 << 10


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return write_noise(tmp_path_factory.mktemp("big") / "big.array_record", 96, RECORD)


async def _collect(ds, **kw):
    async with ds.loader(**kw) as it:
        got = [np.array(b) async for b in it]
        transfers = it.stats().as_dict()["transfers"]
    return got, transfers


@pytest.mark.parametrize("fn", [fns.as_uint8, fns.as_uint8_x4])
async def test_a_batch_larger_than_the_slot_comes_through_shared_memory(big, fn):
    """as_uint8: the slots are sized from the files before the first task; as_uint8_x4:
    the batch is 4x what the files suggest, so the first tasks find their slot too small,
    the arena grows and they run again. Either way nothing comes through the pipe."""
    ds = al.Dataset.from_arrayrecord(big).shuffle(3).repeat(2).map(fn).batch(16)
    ref, _ = await _collect(ds, workers=0, slot_size=SLOT)
    got, transfers = await _collect(ds, workers=2, slot_size=SLOT)
    assert len(got) == len(ref) == 12
    for a, b in zip(got, ref):
        assert a.tobytes() == b.tobytes()
    assert transfers["by_value"] == 0, transfers
    # (the first tasks may run in this process while the workers start)
    assert transfers["in_slot"] + transfers["in_parent"] == 12, transfers
    assert transfers["in_slot"] and transfers["grown"] >= 1, transfers
    assert transfers["slot_bytes"] >= got[0].nbytes
    if fn is fns.as_uint8_x4:
        assert transfers["reruns"] >= 1, transfers


async def test_big_batches_in_stream_mode_come_through_shared_memory(big):
    """A filter before batch(): windows of survivors stacked in columns, larger than the
    slot, are the same as with workers=0."""
    ds = (al.Dataset.from_arrayrecord(big).shuffle(3).map(fns.as_uint8)
          .filter(fns.first_byte_even).batch(8))
    ref, _ = await _collect(ds, workers=0, slot_size=SLOT)
    got, transfers = await _collect(ds, workers=1, slot_size=SLOT, window=32)
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref]
    assert transfers["by_value"] == 0, transfers


async def test_old_slots_are_let_go_after_growing_and_kept_batches_stay_intact(big):
    """A batch kept across a growth still reads the same; once the consumer drops it the
    old generation of slots closes (`Arena.idle`)."""
    ds = al.Dataset.from_arrayrecord(big).shuffle(3).repeat(2).map(fns.as_uint8_x4).batch(16)
    ref, _ = await _collect(ds, workers=0)
    async with ds.loader(workers=1, slot_size=SLOT, prefetch=2) as it:
        kept = [b async for b in it]
        for a, b in zip(kept, ref):
            assert a.tobytes() == b.tobytes()
        arena = it.pool.arena
        del kept, a
        await asyncio.sleep(0)
        gc.collect()
        assert arena.idle


def _flat(batch) -> bytes:
    return b"".join(batch["b"]) if isinstance(batch, dict) else batch.tobytes()


@pytest.mark.parametrize("fn", [fns.as_uint8, fns.as_bytes])
async def test_tasks_sized_from_a_small_first_batch_shrink_before_they_overflow(tmp_path, fn):
    """The first batch is of small records, the rest of records twelve times larger: tasks
    sized from the first batch alone would hold more large batches than a slot does, outgrow
    it and run again. Tasks are sized from the largest batch seen (its arrays, and the bytes
    pickled after them), with room to spare: none runs twice and the slots never grow. The
    batches are those of workers=0."""
    path = tmp_path / "skew.array_record"
    with al.ArrayRecordWriter(path, group_size=1) as w:
        for i in range(16 + 512):  # zeros: the files hint at nothing (they compress away)
            w.write(bytes(1024 if i < 16 else 12 << 10))
    ds = al.Dataset.from_arrayrecord([str(path)]).map(fn).batch(16)
    got = {}
    for workers, slot in ((0, 64 << 20), (2, 1 << 20)):
        async with ds.loader(workers=workers, slot_size=slot, prefetch=2) as it:
            got[workers] = [_flat(b) async for b in it]
            transfers = it.stats().as_dict()["transfers"]
    assert got[2] == got[0] and len(got[0]) == 33
    assert transfers["reruns"] == 0 and transfers["grown"] == 0, transfers


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux only")
def test_memory_stays_within_a_few_batches_per_prefetched_task(tmp_path):
    """Memory (PSS of this process and its workers, shared memory counted once) grows by at
    most ~2 x batch bytes x (prefetch + the batches in the hand-off), measured: 16 MiB
    batches (one per task), prefetch 2, 20 batches."""
    psutil = pytest.importorskip("psutil")
    path = tmp_path / "mib.array_record"
    rng = np.random.default_rng(1)
    block = rng.integers(0, 256, 1 << 18, dtype=np.uint8).tobytes()
    with al.ArrayRecordWriter(path, group_size=1) as w:
        for i in range(64):
            w.write(block[i:] + block[:i])  # 256 KiB each: batches of 64 are 16 MiB
    ds = al.Dataset.from_arrayrecord([str(path)]).shuffle(0).repeat(20).map(fns.as_uint8) \
        .batch(64)
    me = psutil.Process()

    def pss() -> int:
        pids = [me.pid, *(c.pid for c in me.children(recursive=True))]
        return sum(_pss_kb(p) for p in pids) << 10

    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], pss())

    with ds.loader(workers=2, prefetch=2) as it:
        batches = iter(it)
        next(batches)
        base = pss()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        n = 1 + sum(1 for _ in batches)
        done.set()
        sampler.join()
        transfers = it.stats().as_dict()["transfers"]
    assert n == 20 and transfers["by_value"] == 0
    batch = 16 << 20
    assert peak[0] - base <= 2 * batch * (2 + 2), (peak[0] - base) / 2**20


@pytest.mark.parametrize("prefetch", [1, 3])
def test_the_sync_hand_off_counts_among_the_prefetched_batches(big, prefetch):
    """With a consumer slower than the workers, the plain iterator keeps `prefetch` tasks
    ahead, those waiting in its hand-off included: the slots out (so the batches' memory)
    are those and the consumer's one, not `prefetch` + the hand-off's depth + one. The
    batches are those of the async iterator."""
    ds = al.Dataset.from_arrayrecord(big).shuffle(3).repeat(3).map(fns.as_uint8).batch(16)
    ref, _ = asyncio.run(_collect(ds, workers=0))
    got, most = [], 0
    with ds.loader(workers=1, prefetch=prefetch) as it:
        for batch in it:
            got.append(batch.tobytes())
            time.sleep(0.05)  # the workers fill every place meanwhile
            arena = it.pool.arena
            most = max(most, arena.slots - len(arena.free))
    assert got == [b.tobytes() for b in ref]
    assert most <= prefetch + 1, most
