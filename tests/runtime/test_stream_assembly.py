"""Stream mode (filter or pack before the batching): windows sent as columns or packing pieces
give exactly what the old assembler gave over the elements (tests/support/stream_reference.py) —
every output, its state, and every error, in the same order."""

from __future__ import annotations

import asyncio
import contextlib
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioloader.elements import packing
from aioloader.elements.collate import collate
from aioloader.elements.columns import concat, rebuild, stack, take
from aioloader.elements.packing import FirstFit, assemble
from aioloader.elements.transforms import BatchOp, MapOp, PackOp
from aioloader.runtime.assembly import Assembler
from aioloader.runtime.stagestats import StageStats
from aioloader.workers.arena import ShmRef, SlotAlloc, replace_leaves
from aioloader.workers.pieces import Columns, has_arrays, read, window_payload, windows_of
from tests.support import stream_reference

# --- leaves and elements ---------------------------------------------------------------

LEAVES = {
    "int": lambda i: i * 7 - 50,
    "bigint": lambda i: 2**63 + i,  # beyond int64: the window goes as elements
    "float": lambda i: i / 4,
    "bool": lambda i: i % 3 == 0,
    "str": lambda i: f"s{i}",
    "bytes": lambda i: b"b%d" % i,
    "i32": lambda i: np.arange(3, dtype=np.int32) + i,
    "i64": lambda i: np.arange(3, dtype=np.int64) + i,
    "f32x2": lambda i: np.full(2, i, np.float32),
    "u8x2x2": lambda i: np.full((2, 2), i % 256, np.uint8),
    "text_array": lambda i: np.array(f"t{i}"),
    "scalar32": lambda i: np.int32(i),
    "scalar64": lambda i: np.float64(i),
    "zero_d": lambda i: np.array(i, np.int16),
    "list": lambda i: [i, i + 1, i + 2],
    "none": lambda i: None,
}
COMMON = ["int", "float", "str", "i32", "i64", "scalar32"]  # so that windows often agree
leaf_kinds = st.one_of(st.sampled_from(COMMON), st.sampled_from(sorted(LEAVES)))


@st.composite
def element_windows(draw):
    """Windows of elements: each field's kind changes now and then from one window to the
    next (windows then agree or not), and now and then per element (the window then goes as
    elements)."""
    shape = draw(st.sampled_from(["dict", "tuple", "leaf"]))
    fields = ["a", "b", "c"][: draw(st.integers(1, 3))]
    windows = []
    i = 0
    kinds = {f: draw(leaf_kinds) for f in fields}
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 3)) == 0:
            kinds = {f: draw(leaf_kinds) for f in fields}
        mixed = draw(st.integers(0, 5)) == 0
        reorder = shape == "dict" and draw(st.integers(0, 6)) == 0
        elements = []
        for _ in range(draw(st.integers(0, 12))):
            i += 1
            ks = {f: (draw(leaf_kinds) if mixed else k) for f, k in kinds.items()}
            values = {f: LEAVES[k](i) for f, k in ks.items()}
            if shape == "dict":
                order = fields[::-1] if reorder and i % 2 else fields
                elements.append({f: values[f] for f in order})
            elif shape == "tuple":
                elements.append(tuple(values[f] for f in fields))
            else:
                elements.append(values["a"])
        windows.append(elements)
    return windows


class FailOnCall:
    """A map after batch() that raises on its k-th call (0: never)."""

    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == self.k:
            raise RuntimeError(f"call {self.calls}")
        return batch


# --- running both assemblers -------------------------------------------------------------


def canon(x):
    """A comparable form that tells types, dtypes, shapes and key order apart."""
    if isinstance(x, dict):
        return ("dict", [(k, canon(v)) for k, v in x.items()])
    if isinstance(x, tuple):
        return ("tuple", [canon(v) for v in x])
    if isinstance(x, list):
        return ("list", [canon(v) for v in x])
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, x.tolist())
    if isinstance(x, np.generic):
        return (type(x).__name__, x.item())
    return (type(x).__name__, x)


def lend(payload, buf: bytearray):
    """What the pool does with a worker's payload: pickled, then the arrays as views."""
    payload = pickle.loads(pickle.dumps(payload))

    def load(ref):
        if not isinstance(ref, ShmRef):
            return ref
        dtype = np.dtype(ref.dtype)
        return np.ndarray(ref.shape, dtype, buffer=buf, offset=ref.offset)

    return replace_leaves(payload, load)


UNIT = 16  # output positions per window (more than any window holds)


def tasks_of(windows, group: int, stream, slot: bool):
    """What workers send for `windows` taken `group` to a task: (lo, hi, payload, survivors).
    The survivors of window i sit at the end of its positions, as if the first ones were
    filtered out."""
    out = []
    for k in range(0, len(windows), group):
        ws = windows[k : k + group]
        kept = np.array([i * UNIT + UNIT - len(w) + j for i, w in enumerate(ws)
                         for j in range(len(w))], np.int32)
        out.append((k * UNIT, (k + len(ws)) * UNIT,
                    wire([e for w in ws for e in w], stream, slot), kept))
    return out


def wire(elements, stream, slot: bool):
    """The payload a worker sends for a task, through a slot (or by value)."""
    if not slot:
        return pickle.loads(pickle.dumps(window_payload(elements, stream, None)))
    buf = bytearray(1 << 16)
    alloc = SlotAlloc(buf, 0, len(buf))
    payload = window_payload(elements, stream, alloc)
    placed = alloc.export(payload) if has_arrays(payload) else None
    return lend(placed, buf) if placed is not None else pickle.loads(pickle.dumps(payload))


def drain(make, tasks, start, limit=300):
    """Every output of an assembler over `tasks` (after the state `start`): (output, state),
    ("error", type, message), or "end"; stops at the third error in a row."""

    async def run():
        queue = list(tasks)

        async def next_window():
            return queue.pop(0) if queue else None

        asm = make(dict(start), next_window)
        out, errors = [], 0
        try:
            for _ in range(limit):
                try:
                    item, state = await asm.next()
                except StopAsyncIteration:
                    out.append("end")
                    break
                except Exception as exc:
                    out.append(("error", type(exc), str(exc)))
                    errors += 1
                    if errors == 3:
                        break
                    continue
                errors = 0
                out.append((canon(item), state))
        finally:
            if hasattr(asm, "close"):
                asm.close()
        return out

    return asyncio.run(run())


def both(windows, batching, pack_batch, ops_old, ops_new, start, stream, slot, group=1):
    """The old assembler over the elements of each window, and the new one over what
    workers send for them, `group` windows to a task."""
    old = drain(lambda s, nw: stream_reference.Assembler(
        batching, pack_batch, ops_old, s, nw, StageStats("old")),
        [(k * UNIT, w) for k, w in enumerate(windows)], start)
    new = drain(lambda s, nw: Assembler(batching, pack_batch, ops_new, s, nw, StageStats("new"),
                                        UNIT), tasks_of(windows, group, stream, slot), start)
    # `until` (where a pack block closed, for elastic moves) is newer than the reference
    new = [(x[0], {k: v for k, v in x[1].items() if k != "until"})
           if isinstance(x, tuple) and len(x) == 2 else x for x in new]
    return old, new


FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


# --- filter + batch ----------------------------------------------------------------------


@FAST
@given(windows=element_windows(), size=st.integers(1, 7), drop=st.booleans(),
       skip=st.integers(0, 4), fail=st.integers(0, 4), slot=st.booleans(),
       group=st.integers(1, 3))
def test_batches_cut_from_columns_are_what_collate_gave(windows, size, drop, skip, fail, slot,
                                                        group):
    op = BatchOp(size, drop)
    ops = lambda: (MapOp(FailOnCall(fail)),) if fail else ()  # noqa: E731
    old, new = both(windows, op, None, ops(), ops(), {"position": 0, "skip": skip, "rows": 0},
                    op, slot, group)
    assert new == old


@FAST
@given(windows=element_windows(), skip=st.integers(0, 4), group=st.integers(1, 3))
def test_filtered_elements_pass_through_with_their_tags(windows, skip, group):
    old, new = both(windows, None, None, (), (), {"position": 0, "skip": skip, "rows": 0},
                    None, False, group)
    assert new == old


def test_a_window_of_one_structure_travels_as_columns_else_as_elements():
    op = BatchOp(4)
    uniform = [{"x": i, "t": f"{i}", "v": np.full(2, i, np.int32)} for i in range(5)]
    survivors = np.array([0, 1, UNIT, UNIT + 4, UNIT + 9])
    (pos_a, a), (pos_b, b) = read(100, 100 + 2 * UNIT, window_payload(uniform, op, None),
                                  survivors, UNIT)
    assert (pos_a, pos_b) == (100, 100 + UNIT) and isinstance(a, Columns)
    assert canon(a.cols) == canon(collate(uniform[:2]))
    assert canon(b.cols) == canon(collate(uniform[2:]))
    for odd in ({"x": 1.5, "t": "1", "v": np.zeros(2, np.int32)},  # float among ints
                {"t": "1", "x": 1, "v": np.zeros(2, np.int32)},  # keys in another order
                {"x": 1, "t": "1", "v": np.zeros(3, np.int32)},  # another shape
                {"x": 1, "t": "1"}):  # a key missing
        payload = window_payload([*uniform, odd], op, None)
        assert payload == [*uniform, odd]  # the elements, as they were
        assert read(0, 6, payload, np.arange(6), 0) == [(0, [*uniform, odd])]
    assert window_payload(uniform, BatchOp(1), None) is uniform


@settings(max_examples=200, deadline=None)
@given(windows=element_windows(), cut=st.data())
def test_slices_and_joins_of_columns_are_collate(windows, cut):
    """The pure core: for windows of one schema, any run of elements across them."""
    pieces = [(w, stack(w)) for w in windows if w]
    pieces = [(w, s) for w, s in pieces if s is not None]
    if not pieces:
        return
    schema = pieces[0][1][0]
    run = [(w, s) for w, s in pieces if s[0] == schema]
    lo = cut.draw(st.integers(0, len(run[0][0]) - 1))
    hi = cut.draw(st.integers(1, len(run[-1][0])))
    spans = [(w, s, lo if k == 0 else 0, hi if k == len(run) - 1 else len(w))
             for k, (w, s) in enumerate(run)]
    spans = [(w, s, a, b) for w, s, a, b in spans if b > a]
    if not spans:
        return
    elements = [e for w, _, a, b in spans for e in w[a:b]]
    parts = [take(s[0], s[1], a, b) for _, s, a, b in spans]
    got = parts[0] if len(parts) == 1 else concat(schema, parts)
    assert canon(got) == canon(collate(elements))
    for w, s, a, b in spans:
        assert canon(rebuild(s[0], s[1], a, b)) == canon(w[a:b])


# --- pack (+ batch) ------------------------------------------------------------------------


@st.composite
def pack_windows(draw):
    """Windows of elements to pack: mostly uniform pieces; now and then another dtype or
    trailing shape (the signature changes), an element that cannot be packed, or empties."""
    two = draw(st.booleans())
    windows = []
    c = 1
    for _ in range(draw(st.integers(0, 7))):
        dtype = draw(st.sampled_from([np.int32, np.int32, np.int32, np.int64]))
        trail = draw(st.sampled_from([(2,), (2,), (3,)]))
        elements = []
        for _ in range(draw(st.integers(0, 10))):
            e = {"a": np.arange(c, c + draw(st.integers(0, 11)), dtype=dtype)}
            if two:
                e["b"] = np.full((draw(st.integers(0, 7)), *trail), c, np.int16)
            c += 20
            odd = draw(st.integers(0, 40))
            if odd == 0:
                e["z"] = np.zeros(1)  # not packed: an error when reached
            elif odd == 1:
                e["a"] = np.int32(3)  # a scalar: an error when reached
            elif odd == 2:
                e["a"] = np.array([])  # empty, float64: exempt from the dtype check
            elements.append(e)
        windows.append(elements)
    return windows, ({"a": 8, "b": 5} if two else {"a": 8})


@FAST
@given(data=pack_windows(), bins=st.integers(1, 3), batch=st.integers(0, 3),
       drop=st.booleans(), skip=st.integers(0, 3), rows=st.integers(0, 2),
       fail=st.integers(0, 3), slot=st.booleans(), group=st.integers(1, 3))
def test_packed_rows_from_pieces_are_what_pack_first_fit_gave(data, bins, batch, drop, skip,
                                                               rows, fail, slot, group):
    windows, lengths = data
    op = PackOp(lengths, bins)
    pack_batch = BatchOp(batch, drop) if batch else None
    ops = lambda: (MapOp(FailOnCall(fail)),) if fail else ()  # noqa: E731
    old, new = both(windows, op, pack_batch, ops(), ops(),
                    {"position": 0, "skip": skip, "rows": rows}, op, slot, group)
    assert new == old


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 70), min_size=1, max_size=40),
       target=st.integers(70, 200), bins=st.integers(1, 5))
def test_laying_out_long_and_short_pieces_agree(lengths, target, bins):
    """`assemble` copies long pieces one by one and short ones token by token."""
    fit = FirstFit([target], bins)
    for n in lengths:
        b = fit.find([n]) if n else -1
        if b >= 0:
            fit.put(b, [n])
    if not fit.bins:
        return
    total = sum(n for (n,) in fit.lengths)
    data = np.arange(1, 2 * total + 1, dtype=np.int32).reshape(total, 2)
    signature = [((2,), np.dtype(np.int32))]
    outs = []
    for long_piece in (0, 10**9):
        saved, packing._LONG_PIECE = packing._LONG_PIECE, long_piece
        try:
            outs.append(assemble(["f"], [target], fit, [data], signature))
        finally:
            packing._LONG_PIECE = saved
    assert canon(outs[0]) == canon(outs[1])


@pytest.mark.parametrize("stream", [BatchOp(3), PackOp({"a": 4}, 2)])
def test_a_cancelled_consumer_loses_nothing(stream):
    """The assembler's work on a window goes on when the consumer waiting for it is
    cancelled; the next call gets its outputs."""
    elements = [{"a": np.arange(i % 3 + 1 if isinstance(stream, PackOp) else 2, dtype=np.int32)}
                for i in range(12)]

    async def run(cancel: bool):
        queue = [(0, 12, window_payload(elements, stream, None), np.arange(12))]

        async def next_window():
            await asyncio.sleep(0)
            return queue.pop(0) if queue else None

        asm = Assembler(stream, None, (),
                        {"position": 0, "skip": 0, "rows": 0}, next_window, StageStats("a"))
        out = []
        try:
            if cancel:
                task = asyncio.ensure_future(asm.next())
                for _ in range(3):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    out.append(canon(await task))
            while True:
                try:
                    out.append(canon(await asm.next()))
                except StopAsyncIteration:
                    return out
        finally:
            asm.close()

    assert asyncio.run(run(True)) == asyncio.run(run(False))


def test_a_task_says_how_many_of_its_survivors_each_window_holds():
    assert windows_of([0, 3, 4, 9, 10], 11, 4) == ((0, 2), (4, 1), (8, 2))
    assert windows_of([], 5, 4) == ((0, 0), (4, 0))
    assert windows_of([1, 2], 3, 0) == ((0, 2),)  # one window: the whole task
