"""First-fit sequence packing into fixed-size bins (pure NumPy, no I/O, no state).

Variable-length examples (token sequences) waste most of a fixed-shape batch as padding.
Packing places several examples side by side in each row ("bin") of a batch and records
where each one is: for every packed feature `f` the output holds `f` (the tokens, zero
padded), `f + "_segment_ids"` (1, 2, 3, ... per example in a bin, 0 for padding) and
`f + "_positions"` (0, 1, ... within each example, 0 for padding), the same layout Grain's
`FirstFitPackIterDataset` produces, so attention masks and position embeddings can be built
from it.

This module owns the packing decision and the array layout, and deliberately nothing else:
`pack_first_fit` is a pure function of the elements it is given. A batch is determined by
the element stream starting at its first element, and the function reports how many
elements it consumed, so a loader's whole packing state is one integer, the index of the
next unconsumed element. Checkpointing and exact resume follow from that: restoring the
index and calling again reproduces the batches bit for bit, however many elements the caller
happens to pass per call.

Rules, in order of placement:

* Elements are taken in order. Each packed feature is truncated to its target length.
* An element whose packed features are all empty is skipped: it is consumed and leaves no
  trace (no segment). An element with only some empty features is placed normally; in the
  empty features its segment id simply has no tokens. Segment ids are shared across features
  (the k-th element placed in a bin is segment k in every feature), so inputs and targets of
  one example always carry the same id.
* First fit: the element goes to the lowest-numbered bin where every feature still fits.
  The first element that fits in no bin closes the batch and is not consumed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SEGMENT_IDS_SUFFIX = "_segment_ids"
POSITIONS_SUFFIX = "_positions"


def pack_first_fit(
    elements: Sequence[Mapping[str, np.ndarray]],
    length_struct: Mapping[str, int],
    num_packing_bins: int,
    *,
    final: bool = False,
) -> tuple[dict[str, np.ndarray] | None, int]:
    """Pack a prefix of `elements` into one batch of `num_packing_bins` bins, first fit.

    Args:
      elements: dicts of features, in stream order. Every element must have exactly the keys
        of `length_struct`; each value is an array whose first axis is the sequence length
        (trailing axes, if any, must match across the elements of a batch, as must dtypes;
        empty pieces are exempt).
      length_struct: target length of each packed feature; each must be >= 1.
      num_packing_bins: number of bins (rows) in a batch; must be >= 1.
      final: whether `elements` is the end of the stream.

    Returns:
      `(batch, consumed)`:

      * A full batch: some element did not fit in any bin. `consumed` is its index; the next
        batch starts with it.
      * `(None, 0)` when `final` is False and every element fitted: the batch is not decided
        yet. Call again with more elements, starting at the same first element.
      * When `final` is True and every element fitted: the partially filled batch, or None if
        nothing was placed (no elements, or only empty ones), with `consumed == len(elements)`.

      A batch maps each feature `f` to an array of shape `(num_packing_bins, length_struct[f],
      *trailing)` in the inputs' dtype, and `f + "_segment_ids"` / `f + "_positions"` to int32
      arrays of shape `(num_packing_bins, length_struct[f])`. Padding is 0 in all three.
    """
    names = list(length_struct)
    targets = check_pack_config(length_struct, num_packing_bins)
    fit = FirstFit(targets.tolist(), num_packing_bins)
    placed: list[list[np.ndarray]] = []  # truncated arrays of each placed element
    # Per feature, (trailing shape, dtype) of its first non-empty piece in this batch.
    signature: list[tuple[tuple[int, ...], np.dtype] | None] = [None] * len(names)

    for index, element in enumerate(elements):
        arrays = _truncated(element, names, targets, index)
        lengths = [len(a) for a in arrays]
        if not any(lengths):
            continue  # empty element: consumed, contributes nothing
        b = fit.find(lengths)
        if b < 0:
            return _assemble_placed(names, targets, fit, placed, signature), index
        _check_signature(arrays, signature, names, index)
        fit.put(b, lengths)
        placed.append(arrays)

    if not final:
        return None, 0
    if not placed:
        return None, len(elements)
    return _assemble_placed(names, targets, fit, placed, signature), len(elements)


class FirstFit:
    """The placement decisions of one batch, element by element, on lengths alone.

    Plain Python over a few bins beats NumPy's per-call overhead by an order of magnitude
    (this loop runs once per element); many bins are scanned with NumPy.
    """

    def __init__(self, targets: Sequence[int], num_bins: int) -> None:
        self.targets = [int(t) for t in targets]
        self.num_bins = num_bins
        self._one = len(self.targets) == 1
        self._used: list = [0] * num_bins if self._one else [[0] * len(self.targets)
                                                            for _ in range(num_bins)]
        self._wide = num_bins > _SCAN_IN_PYTHON
        self._used_np: Any = (  # (None unless wide)
            np.zeros((num_bins, len(self.targets)), np.int64) if self._wide else None)
        self._segments = [0] * num_bins
        self.lengths: list[Sequence[int]] = []  # of each placed element
        self.bins: list[int] = []  # its bin
        self.segment: list[int] = []  # its segment id within the bin (1, 2, ...)

    def find(self, lengths: Sequence[int]) -> int:
        """The lowest bin where every feature of a non-empty element fits, or -1."""
        if self._wide:
            fits = np.all(self._used_np + np.asarray(lengths) <= self.targets, axis=1)
            return int(np.argmax(fits)) if fits.any() else -1
        if self._one:
            room = self.targets[0] - lengths[0]
            for b, used in enumerate(self._used):
                if used <= room:
                    return b
            return -1
        targets = self.targets
        for b, used in enumerate(self._used):
            for u, n, t in zip(used, lengths, targets):
                if u + n > t:
                    break
            else:
                return b
        return -1

    def scan(self, lengths: Sequence[Sequence[int]], start: int, stop: int) -> int:
        """Place elements `start..stop-1` in order, empty ones skipped; the index of the
        first that fits nowhere (not placed), or `stop`. `find` and `put` in one loop."""
        if self._wide or not self._one:
            for i in range(start, stop):
                row = lengths[i]
                if any(row):
                    b = self.find(row)
                    if b < 0:
                        return i
                    self.put(b, row)
            return stop
        used, segments, target, num_bins = self._used, self._segments, self.targets[0], \
            self.num_bins
        placed_lengths, placed_bins, placed_segment = self.lengths, self.bins, self.segment
        for i in range(start, stop):
            row = lengths[i]
            n = row[0]
            if not n:
                continue
            room = target - n
            for b in range(num_bins):
                if used[b] <= room:
                    break
            else:
                return i
            used[b] += n
            segments[b] += 1
            placed_lengths.append(row)
            placed_bins.append(b)
            placed_segment.append(segments[b])
        return stop

    def put(self, b: int, lengths: Sequence[int]) -> None:
        """Place the element in bin `b` (from `find`)."""
        if self._one:
            self._used[b] += lengths[0]
        else:
            used = self._used[b]
            for f, n in enumerate(lengths):
                used[f] += n
        if self._wide:
            self._used_np[b] += lengths
        self._segments[b] += 1
        self.lengths.append(lengths)
        self.bins.append(b)
        self.segment.append(self._segments[b])


_SCAN_IN_PYTHON = 64  # bins scanned in a Python loop; more with NumPy


def check_pack_config(length_struct: Mapping[str, int], num_packing_bins: int) -> np.ndarray:
    """The one check of pack()'s settings (`PackOp` and `pack_first_fit` both use it);
    returns the target lengths."""
    if isinstance(num_packing_bins, bool) or not isinstance(num_packing_bins, (int, np.integer)):
        raise TypeError(f"num_packing_bins must be an int, got {num_packing_bins!r}")
    if num_packing_bins < 1:
        raise ValueError(f"num_packing_bins must be >= 1, got {num_packing_bins}")
    if not isinstance(length_struct, Mapping):
        raise TypeError(f"length_struct must map feature names to lengths, got "
                        f"{type(length_struct).__name__}")
    if not length_struct:
        raise ValueError("length_struct must name at least one feature")
    for name, length in length_struct.items():
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
            raise TypeError(f"length_struct[{name!r}] must be an int, got {length!r}")
        if length < 1:
            raise ValueError(f"length_struct[{name!r}] must be >= 1, got {length}")
    return np.array([int(v) for v in length_struct.values()], dtype=np.int64)


def _truncated(
    element: Mapping[str, np.ndarray], names: list[str], targets: np.ndarray, index: int
) -> list[np.ndarray]:
    """The element's packed features as arrays, each cut to its target length."""
    for key in element:
        if key not in names:
            raise ValueError(
                f"element {index} has feature {key!r}, which length_struct does not pack "
                f"(packed: {names})"
            )
    arrays = []
    for name, target in zip(names, targets):
        if name not in element:
            raise ValueError(f"element {index} lacks packed feature {name!r}")
        array = np.asarray(element[name])
        if array.ndim == 0:
            raise ValueError(
                f"feature {name!r} of element {index} is a scalar; packed features need a "
                "sequence axis"
            )
        arrays.append(array[:target])
    return arrays


def _check_signature(
    arrays: list[np.ndarray],
    signature: list[tuple[tuple[int, ...], np.dtype] | None],
    names: list[str],
    index: int,
) -> None:
    """Non-empty pieces of a feature must agree on trailing shape and dtype within a batch.

    The first non-empty piece sets them. Empty pieces carry no data and are exempt, so an
    empty feature may be given as, say, `np.array([])` whatever the feature's dtype.
    """
    for f, (name, array) in enumerate(zip(names, arrays)):
        if not len(array):
            continue
        if signature[f] is None:
            signature[f] = (array.shape[1:], array.dtype)
            continue
        trailing, dtype = signature[f]  # type: ignore[misc]  # not None here
        if array.shape[1:] != trailing:
            raise ValueError(
                f"feature {name!r} of element {index} has trailing shape {array.shape[1:]}, "
                f"but earlier elements of the batch have {trailing}"
            )
        if array.dtype != dtype:
            raise ValueError(
                f"feature {name!r} of element {index} has dtype {array.dtype}, but earlier "
                f"elements of the batch have {dtype}"
            )


def _assemble_placed(
    names: list[str],
    targets: np.ndarray,
    fit: FirstFit,
    placed: list[list[np.ndarray]],
    signature: list[tuple[tuple[int, ...], np.dtype] | None],
) -> dict[str, np.ndarray]:
    """`assemble` of the placed elements' pieces, concatenated per feature."""
    datas = []
    for f in range(len(names)):
        pieces = [arrays[f] for arrays in placed if len(arrays[f])]
        datas.append(np.concatenate(pieces, axis=0) if pieces else None)
        if signature[f] is None:  # empty in every placed element: the first one's shape
            signature[f] = (placed[0][f].shape[1:], placed[0][f].dtype)
    return assemble(names, targets, fit, datas, signature)  # type: ignore[arg-type]


def assemble(
    names: Sequence[str],
    targets: Sequence[int],
    fit: FirstFit,
    datas: Sequence[np.ndarray | None],
    signature: Sequence[tuple[tuple[int, ...], np.dtype]],
) -> dict[str, np.ndarray]:
    """Lay the placed elements out.

    `datas[f]` is feature f of the placed elements, concatenated in placement order (None
    when all are empty); `signature[f]` its trailing shape and dtype. Long pieces are copied
    one slice per element (a few NumPy calls each); short ones token by token, vectorized
    (a dozen NumPy calls per feature, whatever the element count).
    """
    num_bins = fit.num_bins
    lengths = np.asarray(fit.lengths, dtype=np.int64).reshape(len(fit.bins), len(names))
    out: dict[str, np.ndarray] = {}
    for f, (name, target) in enumerate(zip(names, targets)):
        target = int(target)
        trailing, dtype = signature[f]
        data = np.zeros((num_bins, target, *trailing), dtype=dtype)
        segment_ids = np.zeros((num_bins, target), dtype=np.int32)
        position_ids = np.zeros((num_bins, target), dtype=np.int32)
        total = int(lengths[:, f].sum())
        if total >= _LONG_PIECE * len(fit.bins):
            _copy_per_element(fit, f, datas[f], data, segment_ids, position_ids)
        elif total:
            _scatter_tokens(fit, lengths[:, f], target, datas[f], data, segment_ids, position_ids)
        out[name] = data
        out[name + SEGMENT_IDS_SUFFIX] = segment_ids
        out[name + POSITIONS_SUFFIX] = position_ids
    return out


_LONG_PIECE = 32  # tokens per piece, on average, from which pieces are copied one by one


def _copy_per_element(fit: FirstFit, f: int, src: np.ndarray | None, data: np.ndarray,
                      segment_ids: np.ndarray, position_ids: np.ndarray) -> None:
    ramp = np.arange(data.shape[1], dtype=np.int32)
    fill = [0] * fit.num_bins  # tokens in each bin so far
    at_src = 0
    for b, segment, lengths in zip(fit.bins, fit.segment, fit.lengths):
        n = lengths[f]
        if n:
            at = fill[b]
            data[b, at : at + n] = src[at_src : at_src + n]  # type: ignore[index]
            segment_ids[b, at : at + n] = segment
            position_ids[b, at : at + n] = ramp[:n]
            fill[b] = at + n
            at_src += n


def _scatter_tokens(fit: FirstFit, lengths: np.ndarray, target: int, src: np.ndarray | None,
                    data: np.ndarray, segment_ids: np.ndarray,
                    position_ids: np.ndarray) -> None:
    bins = np.asarray(fit.bins, dtype=np.int64)
    # Where each element starts within its bin: the summed lengths of the elements placed
    # before it in the same bin (a prefix sum over the bins' runs, sorted stably so that
    # placement order holds within a bin, rebased to each run's first element).
    order = np.argsort(bins, kind="stable")
    run_start = np.searchsorted(bins[order], bins[order], side="left")
    sorted_lengths = lengths[order]
    sorted_starts = np.cumsum(sorted_lengths) - sorted_lengths
    starts = np.empty_like(lengths)
    starts[order] = sorted_starts - sorted_starts[run_start]
    # Per token, its flat output slot: where its element goes, plus its place in the source.
    dest = bins * target + starts
    src_start = np.cumsum(lengths) - lengths
    slot = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(dest - src_start, lengths)
    data.reshape(-1, *data.shape[2:])[slot] = src
    segment_ids.reshape(-1)[slot] = np.repeat(np.asarray(fit.segment, np.int32), lengths)
    position_ids.reshape(-1)[slot] = slot - np.repeat(dest, lengths)
