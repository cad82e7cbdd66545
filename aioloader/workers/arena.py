"""The shared-memory arena the decode pool passes bytes through, both ways.

One memory file (`aioloader.memfile`: on Linux an anonymous memfd that the kernel frees with
the last process holding it, so no kill can leave it behind) cut into slots that are reused
for the life of the pool, so no segment is created or unlinked per batch. A slot has an
input half (the raw chunks the parent fetched from a remote store, each distinct chunk once,
instead of pickling them through a pipe) and an output half, where the worker stacks the
batch's arrays (`SlotAlloc`). The parent hands the batch on as views of the slot, without
a copy, and the slot is reused once the consumer drops them (`Arena.lend`). What is not an
array is pickled into the slot after the arrays when it is more than the pipe holds.
"""

from __future__ import annotations

import pickle
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..memfile import MemoryFile


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
        self.buf, self.pos, self.end = buf, base, base + size
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


class Arena:
    """The parent's shared memory: `slots` reusable slots, each an output half and an input
    half of `slot_size` bytes (pages are only allocated when touched). Workers open `path`;
    `named_path` is set only where there is no memfd (the name to remove if we die)."""

    def __init__(self, slots: int, slot_size: int) -> None:
        self.slot_size = slot_size
        self.free = list(range(slots))
        self._file = MemoryFile("aioloader-arena", slots * 2 * slot_size, named=True)
        self.path: str = self._file.worker_path  # type: ignore[assignment]
        self.named_path = self._file.named_path
        self.map = self._file.map
        assert self.map is not None

    def place_inputs(self, slot: int, raws: list, keys: list | None = None
                     ) -> list[tuple[int, int]] | None:
        """Copy raw chunks into the slot's input half; each one's (offset, length), or None
        if they do not fit. Raws with equal `keys` (the same chunk, wanted by several
        records) are copied once and share a span."""
        if keys is None:
            if sum(len(r) for r in raws) > self.slot_size:
                return None
            pos = (2 * slot + 1) * self.slot_size
            spans = []
            for r in raws:
                n = len(r)
                self.map[pos : pos + n] = r
                spans.append((pos, n))
                pos += n
            return spans
        first: dict = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        if sum(len(raws[i]) for i in first.values()) > self.slot_size:
            return None
        pos = (2 * slot + 1) * self.slot_size
        span: dict = {}
        for key, i in first.items():
            n = len(raws[i])
            self.map[pos : pos + n] = raws[i]
            span[key] = (pos, n)
            pos += n
        return [span[key] for key in keys]

    def take(self) -> int:
        """A free slot, or -1 if every slot is busy or lent (the task then goes by value)."""
        try:
            return self.free.pop()
        except IndexError:
            return -1

    def unpickle(self, ref: Pickled | Blob) -> Any:
        """A payload a worker pickled (see `_outgoing`), from its slot or as sent."""
        if isinstance(ref, Blob):
            return pickle.loads(ref.data)
        with memoryview(self.map) as view:
            return pickle.loads(view[ref.offset : ref.offset + ref.size])

    def give(self, slot: int) -> None:
        """Return a slot; safe from any thread (a list append is atomic)."""
        if slot >= 0:
            self.free.append(slot)

    def lend(self, batch: Any, slot: int) -> Any:
        """The batch's arrays as views of `slot`, without a copy; the slot comes back when
        the last of them is garbage (so a consumer that keeps batches only costs slots)."""
        base = 2 * slot * self.slot_size
        slab = np.frombuffer(self.map, dtype=np.uint8, count=self.slot_size, offset=base)
        weakref.finalize(slab, self.give, slot).atexit = False

        def load(ref: Any) -> Any:
            if not isinstance(ref, ShmRef):
                return ref
            dtype = np.dtype(ref.dtype)
            lo = ref.offset - base
            n = int(np.prod(ref.shape, dtype=np.int64)) * dtype.itemsize
            return slab[lo : lo + n].view(dtype).reshape(ref.shape)

        return replace_leaves(batch, load)

    def close(self) -> None:
        """Unmap, or, while batches lent from it live, leave the map to them: it goes (and
        its memory with it) when the last of them does."""
        self._file.close()
        self.map = None  # type: ignore[assignment]
