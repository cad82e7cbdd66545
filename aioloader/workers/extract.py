"""Records pulled out of large chunks without decoding them whole, and kept for the tasks
after (`Stash`): the worker's side of a horizon (`planning.ChunkWants`).

Under an exact shuffle of a file of large groups (65,536 records a chunk, 64 MiB decoded)
every batch wants a few records of every chunk; decoded whole per task, each chunk costs
~0.2 s and 64 MiB for a handful of records, and no cache of whole chunks helps once the
file's chunks outnumber it. Instead, when a chunk is first wanted, the records that the
next `horizon` output positions want of it are pulled out in one pass (`extract`: a zstd
stream decoded in 256 KiB pieces, each piece still in the CPU's cache, never the whole chunk
in memory) and kept in the stash, so each chunk is decoded once per horizon, and memory is
the wanted records only. The stash is bounded in bytes (the share of the decoded-chunk
cache it replaces); once full, what does not fit is pulled out for each task alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..arrayrecord import ArrayRecordFormatError
from ..arrayrecord.chunk import DEFAULT_MAX_DECODED, simple_parts
from ..arrayrecord.codecs import _MAX_RATIO, ZSTD, _zstd_decompressor, decompress_block
from ..arrayrecord.index import decode_chunk
from ..arrayrecord.layout import CHUNK_SIMPLE
from ..arrayrecord.transposed import decode_transposed
from ..arrayrecord.varint import read_varint

PIECE = 256 << 10  # bytes of decoded values per step of the stream (stays in the CPU's cache)

Entry = tuple[np.ndarray, list[int], bytes]  # sorted record numbers, offsets, their bytes


def extract(raw: Any, start: int, wanted: np.ndarray, *, verify: str = "headers",
            path: str | None = None, chunk: int | None = None,
            expected_records: int | None = None,
            max_decoded: int = DEFAULT_MAX_DECODED) -> Entry:
    """Records `wanted` (sorted, distinct) of the chunk in `raw` (its whole physical range,
    at file offset `start`), as one bytes object and offsets: record `wanted[k]` is
    `data[offs[k]:offs[k + 1]]`. Checks what `decode_chunk` checks (the header, the budget
    before anything is allocated); a zstd values block is decoded as a stream, up to the
    last wanted record; other codecs and transposed chunks are decoded whole."""
    got: list[Entry] = []

    def decoder(header, data, max_decoded):
        if header.chunk_type != CHUNK_SIMPLE:  # transposed (or an error decode_simple names)
            records = decode_transposed(header, data, max_decoded)
            vals, bounds = records.values, records.bounds
            got.append(_slices(vals, bounds, wanted, header.num_records))
            return records
        codec, bounds, values = simple_parts(header, data, max_decoded)
        size = header.decoded_data_size
        if codec != ZSTD or size <= PIECE:
            whole = decompress_block(codec, values, size, size)
            got.append(_slices(whole, bounds, wanted, header.num_records))
        else:
            got.append(_streamed(values, bounds, wanted, size))
        return None

    decode_chunk(raw, start, verify=verify, path=path, chunk=chunk,
                 expected_records=expected_records, max_decoded=max_decoded,
                 whole_range=True, decoder=decoder)
    return got[0]


def _check(wanted: np.ndarray, n: int) -> None:
    if len(wanted) and (int(wanted[0]) < 0 or int(wanted[-1]) >= n):
        raise ArrayRecordFormatError(f"record {int(wanted[-1])} asked of a chunk of {n} "
                                     "records")


def _slices(values: Any, bounds: np.ndarray, wanted: np.ndarray, n: int) -> Entry:
    _check(wanted, n)
    view = memoryview(values)
    b = bounds.tolist()
    parts = [view[b[w] : b[w + 1]] for w in wanted.tolist()]
    offs = [0, *np.cumsum([len(p) for p in parts], dtype=np.int64).tolist()]
    return wanted, offs, b"".join(parts)


def _streamed(values: Any, bounds: np.ndarray, wanted: np.ndarray, size: int) -> Entry:
    """Decode the zstd values block piece by piece, copying out the wanted records."""
    _check(wanted, len(bounds) - 1)
    declared, pos = read_varint(values, 0)
    stream = memoryview(values)[pos:]
    if declared != size:
        raise ArrayRecordFormatError(f"zstd block claims {declared} decoded bytes, header "
                                     f"says {size}")
    if size > _MAX_RATIO[ZSTD] * len(stream) + 64:
        raise ArrayRecordFormatError(f"zstd block of {len(stream)} bytes cannot decode to "
                                     f"{size} bytes")
    starts = bounds[wanted]
    ends = bounds[wanted + 1]
    offs = np.zeros(len(wanted) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=offs[1:])
    out = bytearray(int(offs[-1]))
    dst = memoryview(out)
    s_list, e_list, o_list = starts.tolist(), ends.tolist(), offs.tolist()
    m, k, lo = len(s_list), 0, 0
    try:
        for piece in _zstd_decompressor().read_to_iter(stream, read_size=PIECE // 4,
                                                       write_size=PIECE):
            if k == m:
                break
            hi = lo + len(piece)
            src = memoryview(piece)
            if s_list[k] < lo:  # the rest of a record begun in the last piece
                b = min(e_list[k], hi)
                at = o_list[k] + lo - s_list[k]
                dst[at : at + b - lo] = src[: b - lo]
                if e_list[k] <= hi:
                    k += 1
            while k < m and e_list[k] <= hi:  # records wholly in this piece
                a = s_list[k]
                dst[o_list[k] : o_list[k + 1]] = src[a - lo : e_list[k] - lo]
                k += 1
            if k < m and lo <= s_list[k] < hi:  # one that goes on in the next piece
                a = s_list[k]
                dst[o_list[k] : o_list[k] + hi - a] = src[a - lo :]
            lo = hi
    except ArrayRecordFormatError:
        raise
    except Exception as exc:  # the codec library's own error types
        raise ArrayRecordFormatError(f"zstd stream does not decode: {exc}") from None
    if k < m and not (s_list[k] == e_list[k] and all(
            s_list[j] == e_list[j] for j in range(k, m))):
        raise ArrayRecordFormatError(f"zstd stream ends after {lo} bytes, the record sizes "
                                     f"need {e_list[-1]}")
    return wanted, o_list, bytes(out)


class Stash:
    """Records pulled out of chunks for the current horizon, by chunk (name, start), bounded
    in bytes (records, and 16 bytes each for the index). Full, it keeps what it holds and
    takes nothing more until the next horizon (`full`): every task of an exact shuffle
    wants every chunk again, so evicting one for another would decode both again and
    again."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.horizon: int | None = None
        self.full = False
        self._items: dict[tuple[str, int], tuple[Entry, int]] = {}

    def begin(self, horizon: int) -> None:
        """A task of `horizon`: what an earlier horizon pulled out goes."""
        if horizon != self.horizon:
            self._items.clear()
            self.bytes = 0
            self.horizon = horizon
            self.full = False

    def get(self, key: tuple[str, int]) -> Entry | None:
        item = self._items.get(key)
        return None if item is None else item[0]

    def put(self, key: tuple[str, int], entry: Entry) -> None:
        size = len(entry[2]) + 16 * len(entry[0])
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if self.bytes + size > self.max_bytes:
            self.full = True
            return
        self._items[key] = (entry, size)
        self.bytes += size

    def __len__(self) -> int:
        return len(self._items)


def lookup(entry: Entry, within: np.ndarray) -> np.ndarray | None:
    """Where each of `within` sits in `entry` (its index), or None if any is missing."""
    have = entry[0]
    if not len(have):
        return None if len(within) else np.zeros(0, np.int64)
    pos = np.searchsorted(have, within)
    ok = pos < len(have)
    if not ok.all() or not (have[pos] == within).all():
        return None
    return pos
