"""The shared-memory arena the decode pool passes bytes through, both ways.

One memory file (`aioloader.io.memfile`: on Linux an anonymous memfd that the kernel frees with
the last process holding it, so no kill can leave it behind) cut into slots that are reused
for the life of the pool, so no segment is created or unlinked per batch. A slot has an
input half (the raw chunks the parent fetched from a remote store, each distinct chunk once,
instead of pickling them through a pipe) and an output half, where the worker stacks the
batch's arrays (`SlotAlloc`). The parent hands the batch on as views of the slot, without
a copy, and the slot is reused once the consumer drops them (`Arena.lend`). What is not an
array is pickled into the slot after the arrays when it is more than the pipe holds.
"""

from __future__ import annotations

import itertools
import math
import operator
import pickle
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..io.memfile import MemoryFile


@dataclass(frozen=True)
class ShmRef:
    offset: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Pickled:
    """A payload pickled into its slot's output half (after the arrays placed there)."""

    offset: int
    size: int


@dataclass(frozen=True)
class Blob:
    """A payload pickled by the worker, sent through the pipe as it is (small, or no room)."""

    data: bytes


# Payloads pickled smaller than this go through the pipe: it holds them whole.
PIPE_BYTES = 64 << 10


class SlotAlloc:
    """Hands out arrays inside one slot's output half, so that collate stacks the batch
    right where the parent will read it: no extra copy, and no fresh pages to fault in."""

    def __init__(self, buf: Any, base: int, size: int) -> None:
        self.buf, self.base, self.pos, self.end = buf, base, base, base + size
        self.made: dict[int, tuple[np.ndarray, ShmRef]] = {}

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        dtype = np.dtype(dtype)
        n = _aligned(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        if dtype.hasobject or self.pos + n > self.end:
            return None
        a = np.ndarray(shape, dtype=dtype, buffer=self.buf, offset=self.pos)
        self.made[id(a)] = (a, ShmRef(self.pos, dtype.str, tuple(shape)))
        self.pos += n
        return a

    @property
    def used(self) -> int:
        return self.pos - self.base

    def place(self, blob: bytes) -> Pickled | None:
        """`blob` copied in after the arrays; None if it does not fit."""
        n = len(blob)
        if self.pos + n > self.end:
            return None
        self.buf[self.pos : self.pos + n] = blob
        return Pickled(self.pos, n)

    def export(self, batch: Any) -> Any:
        """The batch with its arrays as references into the slot; None if they don't fit.

        Arrays collate placed are referenced as they are; others (made by a batch op) are
        copied in.
        """
        leaves: list[np.ndarray] = []
        _collect(batch, leaves)
        refs = {}
        for a in leaves:
            made = self.made.get(id(a))
            if made is None or made[0] is not a:
                dst = self(a.shape, a.dtype)
                if dst is None:
                    return None
                dst[...] = a
                made = self.made[id(dst)]
            refs[id(a)] = made[1]
        return replace_leaves(batch, lambda a: refs.get(id(a), a))


def _aligned(n: int) -> int:
    return (n + 63) & ~63


def _is_leaf_list(tree: list) -> bool:
    """A list of str/bytes (collated text): nothing to place, don't walk it."""
    return bool(tree) and isinstance(tree[0], (str, bytes))


def _collect(tree: Any, out: list) -> None:
    if isinstance(tree, dict):
        for v in tree.values():
            _collect(v, out)
    elif isinstance(tree, (tuple, list)):
        if not (isinstance(tree, list) and _is_leaf_list(tree)):
            for v in tree:
                _collect(v, out)
    elif isinstance(tree, np.ndarray) and tree.dtype != object:
        out.append(tree)


def array_leaves(tree: Any) -> list[np.ndarray]:
    """The NumPy arrays (not object arrays) in a batch's tree of dicts, tuples and lists."""
    out: list[np.ndarray] = []
    _collect(tree, out)
    return out


def replace_leaves(tree: Any, fn) -> Any:
    if isinstance(tree, dict):
        return {k: replace_leaves(v, fn) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(replace_leaves(v, fn) for v in tree)
    if isinstance(tree, list):
        return tree if _is_leaf_list(tree) else [replace_leaves(v, fn) for v in tree]
    if isinstance(tree, (np.ndarray, ShmRef)):
        return fn(tree)
    return tree


class _Generation:
    """One memory file of `slots` slots of `slot_size` bytes a half; `out`: its slots not
    free (working, or lent). A retired generation closes once they all come back."""

    def __init__(self, slots: int, slot_size: int) -> None:
        self.slot_size = slot_size
        self.file = MemoryFile("aioloader-arena", slots * 2 * slot_size, named=True)
        self.out: set[int] = set()


class Arena:
    """The parent's shared memory: `slots` reusable slots, each an output half and an input
    half of `slot_size` bytes (pages are only allocated when touched: the size is an address
    range, not memory). Workers open `path`; `named_path` is set only where there is no memfd
    (the name to remove if we die).

    A result larger than a slot grows the arena (`grow`): a new memory file whose slots hold
    it (the workers map it when a task names it, `where`), so big batches keep the zero-copy
    path instead of the pipe. Slot ids say their generation (`id // slots`); the old file is
    closed once its slots are all back, and its memory goes with the last batch lent from it.
    """

    def __init__(self, slots: int, slot_size: int) -> None:
        self.slots = slots
        self.grown = 0  # times the slots grew for a result or input that did not fit
        self._gens: dict[int, _Generation] = {}
        self._gen = -1
        self.free: list[int] = []
        # `give` runs on whatever thread drops a batch's last view (or in a GC pass inside
        # one of our own calls, hence reentrant)
        self._lock = threading.RLock()
        self._new_generation(slot_size)

    def _new_generation(self, slot_size: int) -> None:
        g = _Generation(self.slots, slot_size)
        old = self._gens.get(self._gen)
        self._gen += 1
        self._gens[self._gen] = g
        base = self._gen * self.slots
        self.free = list(range(base, base + self.slots))
        if old is not None and not old.out:
            self._retire(self._gen - 1)

    def _retire(self, gen: int) -> None:
        g = self._gens.pop(gen, None)
        if g is not None:
            g.file.close()

    @property
    def slot_size(self) -> int:
        return self._gens[self._gen].slot_size

    @property
    def map(self) -> Any:
        """The current generation's map (None once closed)."""
        g = self._gens.get(self._gen)
        return None if g is None else g.file.map

    @property
    def path(self) -> str:
        return self._gens[self._gen].file.worker_path  # type: ignore[return-value]

    @property
    def named_path(self) -> str | None:
        return self._gens[self._gen].file.named_path

    @property
    def idle(self) -> bool:
        """Every slot free (none working or lent), and no older generation left open."""
        with self._lock:
            return len(self._gens) <= 1 and len(self.free) == self.slots

    def _of(self, slot: int) -> tuple[_Generation, int]:
        """A slot's generation, and its place in it."""
        return self._gens[slot // self.slots], slot % self.slots

    def where(self, slot: int) -> tuple[str, int, bool, int]:
        """What a worker needs to reach `slot`: the file's path, its slot size, whether the
        path is a name to remove if the parent dies (no memfd), and the slot's place."""
        g, i = self._of(slot)
        return (g.file.worker_path, g.slot_size,  # type: ignore[return-value]
                g.file.named_path is not None, i)

    def map_of(self, slot: int) -> tuple[Any, int, int]:
        """(map, slot size, place) of `slot`, for the inline worker."""
        g, i = self._of(slot)
        return g.file.map, g.slot_size, i

    def grow(self, needed: int) -> None:
        """Make every slot from now on hold `needed` bytes (a half), with room to spare: a
        new generation of slots, twice as large until they do (only touched pages are
        memory, so the spare room costs address space only)."""
        size = self.slot_size
        if needed <= size:
            return
        while size < needed + (needed >> 3):
            size *= 2
        with self._lock:
            self.grown += 1
            self._new_generation(size)

    def place_inputs(self, slot: int, raws: list, keys: list | None = None
                     ) -> list[tuple[int, int]] | None:
        """Copy raw chunks into the slot's input half; each one's (offset, length), or None
        if they do not fit. Raws with equal `keys` (the same chunk, wanted by several
        records) are copied once and share a span."""
        g, i = self._of(slot)
        mem: Any = g.file.map  # mapped while the generation lives
        size = g.slot_size
        if keys is None:
            if sum(len(r) for r in raws) > size:
                return None
            pos = (2 * i + 1) * size
            spans = []
            for r in raws:
                n = len(r)
                mem[pos : pos + n] = r
                spans.append((pos, n))
                pos += n
            return spans
        first: dict = {}
        for k, key in enumerate(keys):
            first.setdefault(key, k)
        if sum(len(raws[k]) for k in first.values()) > size:
            return None
        pos = (2 * i + 1) * size
        span: dict = {}
        for key, k in first.items():
            n = len(raws[k])
            mem[pos : pos + n] = raws[k]
            span[key] = (pos, n)
            pos += n
        return [span[key] for key in keys]

    def take(self) -> int:
        """A free slot, or -1 if every slot is busy or lent (the task then goes by value)."""
        with self._lock:
            try:
                slot = self.free.pop()
            except IndexError:
                return -1
            self._gens[self._gen].out.add(slot)
            return slot

    def unpickle(self, ref: Pickled | Blob, slot: int = -1) -> Any:
        """A payload a worker pickled (see `_outgoing`), from its slot or as sent."""
        if isinstance(ref, Blob):
            return pickle.loads(ref.data)
        mem = self._of(slot)[0].file.map if slot >= 0 else self.map
        with memoryview(mem) as view:  # type: ignore[arg-type]  # mapped
            return pickle.loads(view[ref.offset : ref.offset + ref.size])

    def give(self, slot: int) -> None:
        """Return a slot: to the free list if it is of the current generation, else to its
        generation, which closes with its last slot. From any thread: the loop's, or the
        one where the last view of a lent batch dies."""
        if slot < 0:
            return
        gen = slot // self.slots
        with self._lock:
            g = self._gens.get(gen)
            if g is None:
                return
            g.out.discard(slot)
            if gen == self._gen:
                self.free.append(slot)
            elif not g.out:
                self._retire(gen)

    def lend(self, batch: Any, slot: int) -> Any:
        """The batch's arrays as views of `slot`, without a copy; the slot comes back when
        the last of them is garbage (so a consumer that keeps batches only costs slots)."""
        g, i = self._of(slot)
        size = g.slot_size
        base = 2 * i * size
        slab = np.frombuffer(g.file.map, dtype=np.uint8, count=size,  # type: ignore[arg-type]
                             offset=base)
        weakref.finalize(slab, self.give, slot).atexit = False

        def load(ref: Any) -> Any:
            if not isinstance(ref, ShmRef):
                return ref
            dtype = np.dtype(ref.dtype)
            lo = ref.offset - base
            n = math.prod(ref.shape) * dtype.itemsize  # (no array made of a shape)
            return slab[lo : lo + n].view(dtype).reshape(ref.shape)

        return replace_leaves(batch, load)

    def close(self) -> None:
        """Unmap, or, while batches lent from it live, leave the maps to them: each goes (and
        its memory with it) when the last of them does."""
        with self._lock:
            for gen in list(self._gens):
                self._retire(gen)


def needed_bytes(payload: Any) -> int:
    """The bytes a result's arrays take in a slot (as `SlotAlloc` lays them out)."""
    return sum(_aligned(a.nbytes) for a in array_leaves(payload))


def slot_bytes(batch: Any) -> int:
    """About the bytes `batch` takes in a slot: its arrays (as `SlotAlloc` lays them out),
    and its strings and bytes, pickled after them (a few bytes each besides their text)."""
    if isinstance(batch, dict):
        return sum(slot_bytes(v) for v in batch.values())
    if isinstance(batch, (tuple, list)):
        if batch and isinstance(batch[0], (int, float)):  # numbers (pickled, 9 bytes each)
            return 9 * len(batch)
        texts = _texts_bytes(batch)
        return texts if texts >= 0 else sum(slot_bytes(v) for v in batch)
    if isinstance(batch, np.ndarray):
        return _aligned(batch.nbytes) if batch.dtype != object else \
            sum(slot_bytes(v) for v in batch.flat)
    if isinstance(batch, bytes):
        return len(batch) + 8
    if isinstance(batch, str):
        return (len(batch) if batch.isascii() else 4 * len(batch)) + 8
    return 8


def _texts_bytes(items: list | tuple) -> int:
    """`slot_bytes` of a column of only strings, or only bytes, counted by loops that run
    in C (a batch of text holds thousands; a Python call each cost the parent more than
    the rest of its work on the batch); -1 for any other column."""
    kinds = set(map(type, items))
    if kinds == {bytes}:
        return sum(map(len, items)) + 8 * len(items)
    if kinds != {str}:
        return -1
    wide = itertools.compress(items, map(operator.not_, map(str.isascii, items)))
    return sum(map(len, items)) + 3 * sum(map(len, wide)) + 8 * len(items)
