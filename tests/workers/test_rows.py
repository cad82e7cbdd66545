"""Typed records decoded straight into their batch's rows (`aioloader.workers.rows`): the same
batches as decoding each record, then collating it (a pure property over specs and records,
and end to end over group sizes, codecs, record sizes, local or fetched bytes and worker
counts); a record not of its spec's size, a damaged chunk or a missing file fail as they do
the general way, naming the record."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.arrayrecord.codecs import ZSTD
from aioloader.arrayrecord.varint import encode_varint
from aioloader.elements.collate import collate
from aioloader.elements.transforms import BatchOp, MapOp, OpTimes
from aioloader.elements.typed import Decode, ElementSpec
from aioloader.workers import Pipeline, Task, rows
from aioloader.workers.arena import SlotAlloc
from aioloader.workers.decode import Decoder

from ..support.arrayrecord_util import write_theirs
from ..support.hostile import Chunk, block, craft, simple_chunk

DTYPES = ["<f4", "<f8", "<i8", "<i4", "|u1", "<u2", "|b1", "<c8", "<f2"]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _alloc(size: int = 1 << 22) -> SlotAlloc:
    return SlotAlloc(bytearray(size), 0, size)


@st.composite
def fixed_specs(draw):
    def field():
        return (draw(st.sampled_from(DTYPES)),
                tuple(draw(st.lists(st.integers(0, 3), max_size=3))))

    if draw(st.booleans()):
        spec = ElementSpec.array(*field())
    else:
        names = draw(st.lists(st.text("abxyz", min_size=1, max_size=3), min_size=1,
                              max_size=4, unique=True))
        spec = ElementSpec.of({n: field() for n in names})
    lay = rows.layout(spec)
    if lay is None:  # (every field of 0 bytes)
        return spec, lay, []
    m = draw(st.integers(1, 9))
    records = [draw(st.binary(min_size=lay.size, max_size=lay.size)) for _ in range(m)]
    return spec, lay, records


# -- the layout and the cut: pure -------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fixed_specs())
def test_a_byte_matrix_cut_into_fields_is_what_decode_then_collate_make(case):
    spec, lay, records = case
    if lay is None:
        assert all(np.prod(f.shape) == 0 for f in spec.fields)
        return
    batch, matrix = rows._matrix(lay, len(records), _alloc())
    for k, r in enumerate(records):
        matrix[k] = np.frombuffer(r, np.uint8)
    if not lay.single:
        rows._cut(lay, batch, matrix)
    assert _same(batch, collate([spec.decode(r) for r in records]))


@pytest.mark.parametrize("spec", [
    ElementSpec.array("<f4", (-1, 3)),  # variable rows
    ElementSpec.of({"x": ("<f4", (2,)), "name": ("bytes", ())}),  # a string
    ElementSpec.array(">i4", (2,)),  # collate gives the native byte order
    ElementSpec.array("<f4", (0, 3)),  # no bytes at all
])
def test_records_of_no_fixed_native_layout_take_the_general_path(spec):
    assert rows.layout(spec) is None


def test_a_slot_without_room_for_the_batch_takes_the_general_path():
    lay = rows.layout(ElementSpec.array("|u1", (64,)))
    assert rows._matrix(lay, 4, _alloc(255)) is None
    assert rows._matrix(lay, 4, _alloc(256)) is not None


# -- one task, against its decoded records ----------------------------------------------


SPECS = {
    "image": ElementSpec.array("|u1", (128, 128, 4)),  # 64 KiB: crosses a block boundary
    "small": ElementSpec.array("<f4", (5, 3)),  # 60 bytes: a pread of its own
    "named": ElementSpec.of({"image": ("|u1", (40, 50)), "label": ("<i8", ()),
                             "box": ("<f4", (4,))}),
}


def _elements(spec: ElementSpec, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)

    def value(f):
        dt = np.dtype(f.dtype)
        return rng.integers(0, 256, max(1, int(np.prod(f.shape))) * dt.itemsize,
                            dtype=np.uint8).view(dt).reshape(f.shape)

    if spec.single:
        return [value(spec.fields[0]) for _ in range(n)]
    return [{f.name: value(f) for f in spec.fields} for _ in range(n)]


def _write(path, spec: ElementSpec, n: int, group: int = 1, compression: str = "zstd:3",
           seed: int = 0) -> list[str]:
    with al.ArrayRecordWriter(path, group_size=group, compression=compression,
                              element_spec=spec) as w:
        for e in _elements(spec, n, seed):
            w.write(e)
    return [str(path)]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each spec's records in files of group size 1 and 4, compressed and not."""
    out = {}
    for name, spec in SPECS.items():
        for group in (1, 4):
            for codec in ("zstd:3", "uncompressed"):
                d = tmp_path_factory.mktemp(f"{name}-g{group}-{codec.replace(':', '')}")
                out[name, group, codec] = [
                    *_write(d / "a.array_record", spec, 30, group, codec, 0),
                    *_write(d / "b.array_record", spec, 21, group, codec, 1)]
    return out


@pytest.mark.parametrize("fetched", [False, True])
@pytest.mark.parametrize("codec", ["zstd:3", "uncompressed"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("name", list(SPECS))
async def test_a_tasks_typed_batches_are_its_records_decoded_then_collated(
        written, name, group, codec, fetched):
    spec = SPECS[name]
    pipeline = Pipeline(record_ops=(MapOp(Decode(spec)),), batch=BatchOp(7), batch_ops=())
    indices = np.random.default_rng(1).permutation(51)[:33].astype(np.int64)
    async with al.ArrayRecordSource(written[name, group, codec]) as src:
        refs = src.chunk_refs(indices)
        raws = await src.fetch_refs(refs) if fetched else None
        records = await src.read(indices)
    task = Task(0, indices, np.zeros_like(indices), refs=refs, raws=raws)
    paths = [refs.name(f) for f in refs.file.tolist()]
    times = OpTimes.zeros(1)
    decoder = Decoder()
    made = rows.typed_batches(task, pipeline, decoder, raws, paths, _alloc(), times)
    assert made is not None
    batches, _ = made
    assert len(batches) == 5 and times.items == [33]
    for k, batch in enumerate(batches):
        assert _same(batch, collate([spec.decode(r) for r in records[7 * k : 7 * k + 7]]))
    if group == 1 and not fetched:  # read and decoded in place, no bytes object between
        into = np.zeros((3, rows.layout(spec).size), np.uint8)
        got = decoder.into(refs.take(0, 3), None, into, verify="all",
                           max_decoded=1 << 30, paths=paths[:3])
        assert got == [None, None, None]
        assert [bytes(row) for row in into] == records[:3]


def test_other_pipelines_take_the_general_path():
    spec = SPECS["small"]
    decode = MapOp(Decode(spec))
    assert rows.applies(Pipeline(record_ops=(decode,), batch=BatchOp(4), batch_ops=()))
    for pipeline in [
        Pipeline(record_ops=(MapOp(spec.decode),), batch=BatchOp(4), batch_ops=()),
        Pipeline(record_ops=(decode, MapOp(abs)), batch=BatchOp(4), batch_ops=()),
        Pipeline(record_ops=(decode,), batch=None, batch_ops=()),
        Pipeline(record_ops=(decode,), batch=BatchOp(4, pad=True), batch_ops=()),
        Pipeline(record_ops=(MapOp(Decode(ElementSpec.array("<f4", (-1,)))),),
                 batch=BatchOp(4), batch_ops=()),
    ]:
        assert rows.applies(pipeline) is None


_OPS = {"calls": 0}


def _counted(batch):
    """A batch op that counts its calls (tasks run inline here: this process's count)."""
    _OPS["calls"] += 1
    return batch


def _run(task: Task, spec: ElementSpec, typed: bool, slot: int, batch: int = 8):
    """`task` run inline by the typed pipeline or the general one, in a slot of `slot`
    bytes: its result and the batch op's calls."""
    from aioloader.workers.worker import run_task

    op = MapOp(Decode(spec)) if typed else MapOp(spec.decode)
    pipeline = Pipeline(record_ops=(op,), batch=BatchOp(batch), batch_ops=(MapOp(_counted),))
    assert bool(rows.applies(pipeline)) == typed
    _OPS["calls"] = 0
    task = dataclasses.replace(task, slot=0)
    result = run_task(task, pipeline, Decoder(), (bytearray(2 * slot), slot, 0))
    return result, _OPS["calls"]


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("slot", [1 << 22, 9000])  # room for every batch / for one of two
async def test_a_typed_task_reads_decodes_and_counts_as_the_general_one(written, group, slot):
    spec = SPECS["small"]  # 60-byte records: a batch of 8 takes 480 bytes of the slot
    indices = np.random.default_rng(2).permutation(51)[:16].astype(np.int64)
    async with al.ArrayRecordSource(written["small", group, "zstd:3"]) as src:
        task = Task(0, indices, np.zeros_like(indices), refs=src.chunk_refs(indices))
    if slot < 1 << 22:  # one batch fits, two do not (the general path then asks for room)
        slot = 480 + 64
    typed, typed_calls = _run(task, spec, True, slot)
    general, general_calls = _run(task, spec, False, slot)
    assert (typed.reads, typed.bytes_read, typed.chunks_decoded, typed.chunk_hits,
            typed.count, typed.needed, typed_calls) == (
        general.reads, general.bytes_read, general.chunks_decoded, general.chunk_hits,
        general.count, general.needed, general_calls)
    assert typed.count == 16 and typed.op_items == general.op_items


async def test_a_record_in_frames_without_their_size_fails_as_it_does_the_general_way(
        tmp_path):
    """A values block of two zstd frames that do not say their sizes, adding up to the
    record's: the general path decodes the first frame alone and refuses the record; so
    does the typed path (a decode into a buffer would read on into the second)."""
    spec = ElementSpec.array("|u1", (1024,))
    record = bytes(range(256)) * 4
    frames = b"".join(zstandard.ZstdCompressor(write_content_size=False).compress(part)
                      for part in (record[:500], record[500:]))
    sizes = block(ZSTD, encode_varint(len(record)))
    data = bytes([ZSTD]) + encode_varint(len(sizes)) + sizes + encode_varint(len(record)) + \
        frames
    good = simple_chunk([record], ZSTD)
    path = tmp_path / "frames.array_record"
    path.write_bytes(craft([good, Chunk(data, 1, len(record), span=1), good]))
    for workers in (0, 1):
        typed = _error(al.Dataset.from_arrayrecord(str(path), decode=spec).batch(3), workers)
        general = _error(al.Dataset.from_arrayrecord(str(path)).map(spec.decode).batch(3),
                         workers)
        assert "frames.array_record" in typed and typed == general


# -- end to end --------------------------------------------------------------------------


def _loaded(ds, workers: int | str) -> list:
    if workers == "threads":
        with ds.loader(workers=2, executor="threads") as it:
            return list(it)
    with ds.loader(workers=workers) as it:
        return list(it)


@pytest.mark.parametrize("workers", [0, 1, 2, "threads"])
@pytest.mark.parametrize("key", [("image", 1, "zstd:3"), ("named", 4, "zstd:3"),
                                 ("small", 1, "uncompressed")])
def test_typed_loaders_give_the_batches_of_decode_then_batch(written, key, workers):
    spec, paths = SPECS[key[0]], written[key]
    want = _loaded(al.Dataset.from_arrayrecord(paths).shuffle(3).map(spec.decode).batch(8), 0)
    got = _loaded(al.Dataset.from_arrayrecord(paths, decode=spec).shuffle(3).batch(8), workers)
    assert len(got) == len(want) == 7
    assert all(_same(a, b) for a, b in zip(got, want))


def _damage(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def _error(ds, workers: int) -> str:
    with pytest.raises(Exception) as err:
        _loaded(ds, workers)
    return f"{type(err.value).__name__}: {err.value}"


@pytest.mark.parametrize("workers", [0, 1])
async def test_a_damaged_record_fails_as_it_does_the_general_way(tmp_path, workers):
    spec = SPECS["image"]
    paths = _write(tmp_path / "d.array_record", spec, 12)
    async with al.ArrayRecordSource(paths) as src:
        refs = src.chunk_refs(np.asarray([5]))
    _damage(paths[0], (int(refs.start[0]) + int(refs.end[0])) // 2)  # record 5's data
    typed = al.Dataset.from_arrayrecord(paths, decode=spec).batch(4)
    general = al.Dataset.from_arrayrecord(paths).map(spec.decode).batch(4)
    err = _error(typed, workers)
    assert "d.array_record" in err and "hash" in err
    assert err == _error(general, workers)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_record_not_of_its_specs_size_is_named(tmp_path, workers):
    path = tmp_path / "short.array_record"
    spec = ElementSpec.array("|u1", (128, 128, 4))
    with al.ArrayRecordWriter(path, element_spec=spec) as w:
        for k in range(9):
            w.write(np.zeros((128, 128, 4), np.uint8) if k != 6 else b"\1" * 70_000)
    err = _error(al.Dataset.from_arrayrecord(str(path), decode="auto").batch(4), workers)
    assert "record 6" in err and "70000 bytes" in err and "needs 65536" in err


def test_a_file_gone_before_its_records_are_read_is_named(tmp_path):
    spec = SPECS["small"]
    paths = _write(tmp_path / "gone.array_record", spec, 10)
    ds = al.Dataset.from_arrayrecord(paths, decode=spec).batch(4)
    with ds.loader(workers=0) as it:
        os.remove(paths[0])
        with pytest.raises(Exception, match=r"gone\.array_record"):
            list(it)


@pytest.mark.parametrize("size", [100, 65536])
async def test_records_array_records_writer_wrote_are_decoded_in_place(tmp_path, size):
    """array_record's writer leaves its frames' sizes out: such records, too, are decoded
    straight into their rows (none through a bytes object)."""
    records = [np.random.default_rng(k).integers(0, 256, size, np.uint8).tobytes()
               for k in range(6)]
    path = tmp_path / "theirs.array_record"
    write_theirs(path, records, "group_size:1,zstd:3")
    async with al.ArrayRecordSource(str(path)) as src:
        refs = src.chunk_refs(np.arange(6))
    into = list(np.zeros((6, size), np.uint8))
    got = Decoder().into(refs, None, into, verify="all", max_decoded=1 << 30,
                         paths=[str(path)] * 6)
    assert got == [None] * 6 and [row.tobytes() for row in into] == records
