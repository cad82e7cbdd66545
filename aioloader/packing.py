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
    num_features = len(names)

    used = np.zeros((num_packing_bins, num_features), dtype=np.int64)
    segments = np.zeros(num_packing_bins, dtype=np.int64)  # elements placed in each bin
    placed: list[list[np.ndarray]] = []  # truncated arrays of each placed element
    placed_bin: list[int] = []
    placed_segment: list[int] = []
    # Per feature, (trailing shape, dtype) of its first non-empty piece in this batch.
    signature: list[tuple[tuple[int, ...], np.dtype] | None] = [None] * num_features

    for index, element in enumerate(elements):
        arrays = _truncated(element, names, targets, index)
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=num_features)
        if not lengths.any():
            continue  # empty element: consumed, contributes nothing
        fits = np.all(used + lengths <= targets, axis=1)
        if not fits.any():
            batch = _assemble(
                names, targets, num_packing_bins, placed, placed_bin, placed_segment, signature
            )
            return batch, index
        _check_signature(arrays, signature, names, index)
        b = int(np.argmax(fits))
        used[b] += lengths
        segments[b] += 1
        placed.append(arrays)
        placed_bin.append(b)
        placed_segment.append(int(segments[b]))

    if not final:
        return None, 0
    if not placed:
        return None, len(elements)
    batch = _assemble(
        names, targets, num_packing_bins, placed, placed_bin, placed_segment, signature
    )
    return batch, len(elements)


def check_pack_config(length_struct: Mapping[str, int], num_packing_bins: int) -> np.ndarray:
    """The one check of pack()'s settings (`PackOp` and `pack_first_fit` both use it);
    returns the target lengths."""
    if isinstance(num_packing_bins, bool) or not isinstance(num_packing_bins, (int, np.integer)):
        raise TypeError(f"num_packing_bins must be an int, got {num_packing_bins!r}")
    if num_packing_bins < 1:
        raise ValueError(f"num_packing_bins must be >= 1, got {num_packing_bins}")
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
        trailing, dtype = signature[f]
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


def _assemble(
    names: list[str],
    targets: np.ndarray,
    num_bins: int,
    placed: list[list[np.ndarray]],
    placed_bin: list[int],
    placed_segment: list[int],
    signature: list[tuple[tuple[int, ...], np.dtype] | None],
) -> dict[str, np.ndarray]:
    """Lay the placed elements out, vectorized per feature (no per-token Python work)."""
    bins = np.asarray(placed_bin, dtype=np.int64)
    segment = np.asarray(placed_segment, dtype=np.int32)
    # Sort the placed elements by bin, stably so placement order holds within a bin; the
    # element starting each bin's run is found by searching the sorted bins.
    order = np.argsort(bins, kind="stable")
    run_start = np.searchsorted(bins[order], bins[order], side="left")
    out: dict[str, np.ndarray] = {}
    for f, (name, target) in enumerate(zip(names, targets)):
        target = int(target)
        pieces = [arrays[f] for arrays in placed]
        # A feature empty in every placed element takes its shape and dtype from the first.
        trailing, dtype = signature[f] or (pieces[0].shape[1:], pieces[0].dtype)
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        # Where each element starts within its bin: the summed lengths of the elements placed
        # before it in the same bin (a prefix sum over the bin-sorted run, rebased per bin).
        sorted_lengths = lengths[order]
        sorted_starts = np.cumsum(sorted_lengths) - sorted_lengths
        starts = np.empty_like(lengths)
        starts[order] = sorted_starts - sorted_starts[run_start]

        # Per token: its element, its position within the element, its flat output slot.
        owner = np.repeat(np.arange(len(pieces)), lengths)
        token_start = np.cumsum(lengths) - lengths
        positions = np.arange(len(owner), dtype=np.int64) - token_start[owner]
        slot = bins[owner] * target + starts[owner] + positions

        data = np.zeros((num_bins * target, *trailing), dtype=dtype)
        segment_ids = np.zeros(num_bins * target, dtype=np.int32)
        position_ids = np.zeros(num_bins * target, dtype=np.int32)
        if len(owner):
            data[slot] = np.concatenate([p for p in pieces if len(p)], axis=0)
            segment_ids[slot] = segment[owner]
            position_ids[slot] = positions
        out[name] = data.reshape(num_bins, target, *trailing)
        out[name + SEGMENT_IDS_SUFFIX] = segment_ids.reshape(num_bins, target)
        out[name + POSITIONS_SUFFIX] = position_ids.reshape(num_bins, target)
    return out
