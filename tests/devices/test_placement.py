"""Device placement off the consumer's thread (`aioloader.runtime.placement`): the same
arrays and states as the plain loader, at any `prefetch_to_device`; nothing placed inside
`next()`; an error in placement raised by `next()`, naming the batch; no thread left by a
close from any thread, or by an iterator dropped unclosed; the default prefetch."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import numpy as np
import pytest

import aioloader as al

from ..support import pipeline_fns as fns
from .test_jax import ids_pipeline

jax = pytest.importorskip("jax")
NamedSharding = jax.sharding.NamedSharding
P = jax.sharding.PartitionSpec


def strings_in_batch_3(element: dict) -> dict:
    """In file order with batch(8), ids 48..62 (even) make batch 3: it alone gets a string
    leaf, which no device takes."""
    i = int(element["id"])
    out = {"id": element["id"]}
    if 48 <= i <= 62 and i % 2 == 0:
        out["tag"] = np.array(["x"])
    return out


def slow(element: dict) -> dict:
    time.sleep(0.05)
    return element


def placement_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aioloader-placement")]


def plain(ds, **kw):
    """Batches and the loader's state after each, from the plain iterator."""
    out = []
    with ds.loader(**kw) as ld:
        for b in ld:
            out.append((np.asarray(b["id"]).tolist(), ld.get_state()))
    return out


@pytest.mark.parametrize("depth", [1, 2, 3, 5])
def test_same_arrays_and_states_as_the_plain_loader(data, depth):
    sharding = NamedSharding(jax.make_mesh((4,), ("data",)), P("data"))
    want = plain(ids_pipeline(data))
    it = ids_pipeline(data).loader().to_jax(sharding, prefetch_to_device=depth)
    got = []
    for b in it:
        assert isinstance(b["id"], jax.Array) and b["id"].sharding == sharding
        got.append((np.asarray(b["id"]).tolist(), it.get_state()))
    assert got == want
    assert not placement_threads()  # the end of the iteration ends the thread


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_pad_final_same_batches_and_states(data, depth):
    want = plain(ids_pipeline(data, batch=32, drop=False))
    it = ids_pipeline(data, batch=32, drop=False).loader().to_jax(pad_final=True,
                                                                   prefetch_to_device=depth)
    got = [(np.asarray(b["id"])[np.asarray(b["mask"])].tolist(), it.get_state()) for b in it]
    assert got == want


def test_next_places_nothing_on_the_consumers_thread(data):
    """Host-to-device transfers are refused on this thread (jax's guard is per thread):
    `next()` only hands over what the placement thread placed."""
    want = [ids for ids, _ in plain(ids_pipeline(data))]
    it = ids_pipeline(data).loader().to_jax()
    with jax.transfer_guard_host_to_device("disallow_explicit"):
        got = [next(it) for _ in range(len(want))]
        with pytest.raises(StopIteration):
            next(it)
    assert [np.asarray(b["id"]).tolist() for b in got] == want


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_state_after_k_batches_resumes_at_batch_k(data, depth):
    full = [ids for ids, _ in plain(ids_pipeline(data))]
    for k in (1, 4, 11):
        it = ids_pipeline(data).loader().to_jax(prefetch_to_device=depth)
        seen = [np.asarray(next(it)["id"]).tolist() for _ in range(k)]
        state = it.get_state()
        it.close()
        assert not placement_threads()
        rest = [ids for ids, _ in plain(ids_pipeline(data), state=state)]
        assert seen + rest == full


def test_an_error_in_placement_names_the_batch(data):
    ds = (al.Dataset.from_arrayrecord(data).map(fns.decode).map(strings_in_batch_3)
          .batch(8, drop_remainder=True))
    it = ds.loader().to_jax()
    for _ in range(3):
        next(it)
    with pytest.raises(TypeError, match="not a valid JAX array type") as err:
        next(it)
    assert "while placing batch 3 (counted from 0) of to_jax()" in "\n".join(
        err.value.__notes__)
    with pytest.raises(StopIteration):  # raised once; then the iteration has ended
        next(it)
    it.close()
    assert not placement_threads()


def test_pad_final_refuses_non_dict_batches_with_the_same_error(data):
    ds = al.Dataset.from_arrayrecord(data).map(fns.decode).map(fns.just_id).batch(8)
    it = ds.loader().to_jax(pad_final=True)
    with pytest.raises(TypeError, match=r"pad_final=True needs dict batches"):
        next(it)
    it.close()


def test_close_from_another_thread_mid_stream_leaves_no_thread(data):
    it = ids_pipeline(data).loader().to_jax(prefetch_to_device=2)
    next(it)
    assert len(placement_threads()) == 1
    closer = threading.Thread(target=it.close)
    closer.start()
    closer.join()
    assert not placement_threads()
    with pytest.raises(StopIteration):
        while True:  # what was placed before the close may still come; then the end
            next(it)


def test_close_while_the_consumer_waits_ends_its_iteration(data):
    ds = (al.Dataset.from_arrayrecord(data).map(fns.decode).map(fns.only_id_noise_det)
          .map(slow).batch(8))
    it = ds.loader().to_jax()
    ended = threading.Event()

    def consume() -> None:
        for _ in it:
            pass
        ended.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.2)  # the consumer waits in next()
    it.close()
    consumer.join(30)
    assert ended.is_set() and not placement_threads()


def test_an_iterator_dropped_unclosed_leaves_no_thread(data):
    it = ids_pipeline(data).loader().to_jax(prefetch_to_device=2)
    next(it)
    del it
    deadline = time.monotonic() + 10
    while placement_threads() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    assert not placement_threads()


def test_async_same_arrays_states_and_error(data):
    want = plain(ids_pipeline(data))

    async def run(depth):
        async with ids_pipeline(data).loader() as ld:
            it = ld.to_jax_async(prefetch_to_device=depth)
            return [(np.asarray(b["id"]).tolist(), it.get_state()) async for b in it]

    for depth in (1, 2, 3):
        assert asyncio.run(run(depth)) == want
        assert not placement_threads()

    async def failing():
        ds = (al.Dataset.from_arrayrecord(data).map(fns.decode).map(strings_in_batch_3)
              .batch(8, drop_remainder=True))
        async with ds.loader() as ld:
            it = ld.to_jax_async()
            for _ in range(3):
                await it.__anext__()
            with pytest.raises(TypeError) as err:
                await it.__anext__()
            with pytest.raises(StopAsyncIteration):
                await it.__anext__()
            return err.value

    err = asyncio.run(failing())
    assert "while placing batch 3 (counted from 0)" in "\n".join(err.__notes__)
    assert not placement_threads()


def test_async_aclose_mid_stream_leaves_no_thread(data):
    async def run():
        async with ids_pipeline(data).loader() as ld:
            it = ld.to_jax_async()
            await it.__anext__()
            await it.aclose()
            return placement_threads()

    assert asyncio.run(run()) == []


def test_default_prefetch_grows_with_the_workers(data):
    from aioloader.options import default_prefetch

    assert [default_prefetch(w) for w in (0, 1, 2, 3, 8, 16, 64)] == [4, 4, 4, 6, 16, 32, 32]
    assert al.PrefetchOptions().prefetch is None
    assert al.PrefetchOptions(prefetch=3).prefetch == 3
    assert al.PrefetchOptions(prefetch="auto").prefetch == "auto"
    ds = ids_pipeline(data)
    for kw, want in (({}, 4), ({"prefetch": 2}, 2)):
        with ds.loader(**kw) as ld:
            assert ld.prefetch == want


def test_default_prefetch_of_three_workers_gives_the_same_batches(data):
    want = plain(ids_pipeline(data))
    with ids_pipeline(data).loader(workers=3) as ld:
        assert ld.prefetch == 6
        got = [(np.asarray(b["id"]).tolist(), ld.get_state()) for b in ld]
    assert got == want


def big_ids(element: dict) -> dict:
    """Ids past int32's range: an int32 placement would wrap them."""
    return {"id": np.int64(element["id"]) + np.int64(1 << 40)}


def test_placement_keeps_the_jax_settings_where_to_jax_is_called(data):
    """jax's settings are per thread: with x64 on where `to_jax()` is called, the placement
    thread places int64 as int64 (not silently wrapped to int32), on the default device
    chosen there."""
    ds = (al.Dataset.from_arrayrecord(data).map(fns.decode).map(big_ids).batch(8))
    want = [np.asarray(b["id"]).tolist() for b in ds.loader()]
    device = jax.devices()[-1]
    with jax.enable_x64(True), jax.default_device(device):
        it = ds.loader().to_jax(prefetch_to_device=2)
        got = list(it)
    assert [np.asarray(b["id"]).tolist() for b in got] == want
    assert {b["id"].dtype for b in got} == {np.dtype(np.int64)}
    assert {d for b in got for d in b["id"].devices()} == {device}


def test_closing_the_loader_ends_the_placement_thread(data):
    """A loader closed (its `with` left) while its to_jax iterator is still referenced: the
    placement thread ends, rather than wait for room with placed batches in hand."""
    with ids_pipeline(data).loader() as ld:
        it = ld.to_jax(prefetch_to_device=3)
        next(it)
        deadline = time.monotonic() + 10
        while it._feed.free and time.monotonic() < deadline:  # the thread fills its room
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while placement_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not placement_threads()
    assert it is not None  # (still referenced)
