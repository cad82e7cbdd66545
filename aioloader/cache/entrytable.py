"""A loaded index-cache entry's tables as `FileIndex` views, after the checks any real index
passes (`index_cache` owns the entry's file, name, key and digest; this module owns what its
arrays must satisfy before a record is read through them: a digest alone would pass a buggy
writer's entry)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import formats as fmts
from ..arrayrecord import FileIndex
from ..io.storage import ObjectInfo, redact

HEAD_BYTES = 64  # a footer chunk's header (40 bytes), with a block header inside it or not


@dataclass(frozen=True)
class CachedTable:
    """The indices of a list of files, all views of one mapped `bounds` array (each file's
    chunk offsets then its footer offset, as `RecordTable` lays them out)."""

    indices: list[FileIndex]
    bounds: np.ndarray
    heads: np.ndarray  # (files, HEAD_BYTES) uint8: each checked file's footer head, else 0


class CacheEntryError(ValueError):
    """Why an entry was not used (internal: it becomes a warning and a rebuild)."""



def indices(files: list, arrays: dict[str, np.ndarray], infos: Sequence[ObjectInfo],
             kinds: Sequence[str]) -> CachedTable:
    """The files' indices as views of the entry's arrays, after the checks any real index
    passes (a digest alone would pass a buggy writer's entry)."""
    bounds, decoded, counts = arrays["bounds"], arrays["decoded"], arrays["counts"]
    if len(arrays["heads"]) != len(files) * HEAD_BYTES:
        raise CacheEntryError("its footer heads do not match its files")
    chunks = np.array([f[1] for f in files], dtype=np.int64)
    footers = np.array([f[0] for f in files], dtype=np.int64)
    if (chunks < 0).any() or len(bounds) != int(chunks.sum()) + len(files) or \
            len(decoded) != int(chunks.sum()):
        raise CacheEntryError("its arrays do not hold its files' chunks")
    ends = np.cumsum(chunks + 1)  # one past each file's footer offset in bounds
    firsts = ends - chunks - 1
    if any((f[5] if len(f) > 5 else fmts.ARRAYRECORD) != kind
           for f, kind in zip(files, kinds)):
        raise CacheEntryError("it holds files of another record format")
    limits = np.array([fmts.get(kind).index_limits(i.size) for kind, i in zip(kinds, infos)],
                      dtype=np.int64).reshape(len(files), 2)
    sizes = np.array([i.size for i in infos], dtype=np.int64)
    # (a footer offset of 0 only in an empty file: a TFRecord file of no records)
    if (bounds[ends - 1] != footers).any() or ((footers <= 0) & (sizes > 0)).any() or \
            (footers < 0).any() or (footers > limits[:, 1]).any():
        raise CacheEntryError("its footer offsets are outside their files")
    steps = np.diff(bounds)
    ok = steps > 0
    ok[ends[:-1] - 1] = True  # from one file's footer to the next file's first chunk: any
    if len(bounds) and (not ok.all() or
                        (bounds[firsts[chunks > 0]] < limits[chunks > 0, 0]).any()):
        raise CacheEntryError("its chunk offsets are not increasing within the files")
    if (decoded.dtype == np.int64 and len(decoded) and decoded.min() < 0):
        raise CacheEntryError("its decoded sizes are out of range")
    stored = np.array([bool(f[2]) for f in files], dtype=bool)
    if len(counts) != int(chunks[stored].sum()):
        raise CacheEntryError("its record counts do not match its files' chunks")
    contexts = arrays.get("contexts", np.zeros(0, np.uint8))
    lengths = [f[6] if len(f) > 6 else 0 for f in files]
    if not all(isinstance(n, int) and n >= 0 for n in lengths) or \
            sum(lengths) != len(contexts):
        raise CacheEntryError("its contexts do not match its files")
    out, c_at, d_at, x_at = [], 0, 0, 0
    for k, (footer, n, has_counts, options, spec, *_) in enumerate(files):
        lo = int(firsts[k])
        if has_counts:
            rec = counts[c_at : c_at + n]
            c_at += n
            spans = bounds[lo + 1 : lo + n + 1] - bounds[lo : lo + n]
            # (a row of a columnar format may take less than a byte, a run of equal values;
            # and its chunks of no rows cover the bytes no selected column has)
            least = 1
            if fmts.base(kinds[k]) in fmts.COLUMNAR:
                spans, least = np.iinfo(np.int64).max, 0
            if n and ((rec < least).any() or (rec > spans).any()):
                raise CacheEntryError("its record counts are out of range")
        else:
            rec = np.broadcast_to(np.int64(1), (n,))
        ix = FileIndex(path=redact(infos[k].url), size=infos[k].size, footer_offset=int(footer),
                       chunk_offsets=bounds[lo : lo + n], chunk_records=rec,
                       chunk_decoded_sizes=decoded[d_at : d_at + n],
                       writer_options=str(options), element_spec=str(spec),
                       context=contexts[x_at : x_at + lengths[k]].tobytes())
        vars(ix)["chunk_ends"] = bounds[lo + 1 : lo + n + 1]
        if fmts.get(kinds[k]).contextual:
            try:
                fmts.get(kinds[k]).check_cached(ix)
            except Exception as err:
                raise CacheEntryError(f"file {k}: {err}") from None
        d_at += n
        x_at += lengths[k]
        out.append(ix)
    return CachedTable(out, bounds, arrays["heads"].reshape(len(files), HEAD_BYTES))
