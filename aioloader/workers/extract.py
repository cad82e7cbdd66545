"""Records pulled out of large chunks without decoding them whole, into a stash that every
worker reads (`StashFile`): the workers' side of a horizon (`planning.ChunkWants`).

Under an exact shuffle of a file of large groups (65,536 records a chunk, 64 MiB decoded)
every batch wants a few records of every chunk; decoded whole per task, each chunk costs
~0.2 s and 64 MiB for a handful of records, and no cache of whole chunks helps once the
file's chunks outnumber it. Instead, once per horizon, the records that the next output
positions want of each chunk are pulled out in one pass (`extract`: a zstd stream decoded
in 256 KiB pieces, each piece still in the CPU's cache, never the whole chunk in memory),
each chunk by one worker (a fill job), into one shared-memory file the size of the whole
decoded-chunk cache; every task of the horizon, in whichever worker, reads its records
there. So each chunk is decoded once per horizon whatever the worker count, and the
horizon is as long as the whole cache holds (a private stash per worker would decode
every chunk in every worker over 1/W of the cache: W^2 the decoding per record). What a
chunk's region cannot hold (sizes vary), or a task of a past horizon, is pulled out for
the task alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..arrayrecord import ArrayRecordFormatError
from ..arrayrecord.chunk import DEFAULT_MAX_DECODED, DEFAULT_VERIFY, simple_parts
from ..arrayrecord.codecs import _MAX_RATIO, ZSTD, _zstd_decompressor, decompress_block
from ..arrayrecord.index import decode_chunk
from ..arrayrecord.layout import CHUNK_SIMPLE
from ..arrayrecord.transposed import decode_transposed
from ..arrayrecord.varint import read_varint
from ..io.memfile import MemoryFile

PIECE = 256 << 10  # bytes of decoded values per step of the stream (stays in the CPU's cache)

# sorted record numbers, offsets (record k is data[offs[k]:offs[k + 1]]), their bytes
Entry = tuple[np.ndarray, Any, Any]
HEAD = 16  # an entry in the stash file: records n, data bytes; n numbers; n + 1 offsets; data


def extract(raw: Any, start: int, wanted: np.ndarray, *, verify: str = DEFAULT_VERIFY,
            path: str | None = None, chunk: int | None = None,
            expected_records: int | None = None,
            max_decoded: int = DEFAULT_MAX_DECODED, into: Any = None,
            sink: Any = None) -> Entry:
    """Records `wanted` (sorted, distinct) of the chunk in `raw` (its whole physical range,
    at file offset `start`), as bytes and offsets: record `wanted[k]` is
    `data[offs[k]:offs[k + 1]]`. `into`: a writable region (of the stash file, 24 bytes or
    more) to lay the
    entry out in (`read_entry`), with the longest prefix of `wanted` that fits; the entry
    returned is then that prefix, as views of it. Checks what `decode_chunk` checks (the
    header, the budget before anything is allocated); a zstd values block is decoded as a
    stream, up to the last wanted record; other codecs and transposed chunks are decoded
    whole. `sink`: a `spill.SpillWriter` that every decoded record goes to as well (the
    stream is then decoded to its end)."""
    got: list[Entry] = []

    def decoder(header, data, max_decoded):
        _check(wanted, header.num_records)
        if header.chunk_type != CHUNK_SIMPLE:  # transposed (or an error decode_simple names)
            records = decode_transposed(header, data, max_decoded)
            if sink is not None:
                sink.whole(records.bounds, records.values)
            got.append(slices(records.values, records.bounds, wanted, into))
            return records
        codec, bounds, values = simple_parts(header, data, max_decoded)
        size = header.decoded_data_size
        if codec != ZSTD or size <= PIECE:
            whole = decompress_block(codec, values, size, size)
            if sink is not None:
                sink.whole(bounds, whole)
            got.append(slices(whole, bounds, wanted, into))
        else:
            got.append(_streamed(values, bounds, wanted, size, into, sink))
        return None

    decode_chunk(raw, start, verify=verify, path=path, chunk=chunk,
                 expected_records=expected_records, max_decoded=max_decoded,
                 whole_range=True, decoder=decoder)
    return got[0]


def _place(bounds: np.ndarray, wanted: np.ndarray, into: Any
           ) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """Where the records go: the wanted records that do (all, or the prefix that fits
    `into` with the entry's head), their offsets, and the buffer their bytes go in."""
    return _placed(bounds[wanted + 1] - bounds[wanted], wanted, into)


def lay_out(records: list[bytes], wanted: np.ndarray, into: Any = None) -> Entry:
    """An entry of `records` (record `wanted[k]` is `records[k]`: a format's records as
    the stash keeps them, `RecordFormat.stash_records`), laid out in `into` as `extract`
    lays one out (the longest prefix that fits)."""
    sizes = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    wanted, offs, dst = _placed(sizes, np.asarray(wanted, dtype=np.int64), into)
    dst[:] = b"".join(records[: len(wanted)])  # (one copy into the region)
    return wanted, offs, dst


def _placed(sizes: np.ndarray, wanted: np.ndarray, into: Any
            ) -> tuple[np.ndarray, np.ndarray, memoryview]:
    offs = np.zeros(len(wanted) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offs[1:])
    if into is None:
        return wanted, offs, memoryview(bytearray(int(offs[-1])))
    need = HEAD + 8 + 16 * np.arange(len(offs), dtype=np.int64) + offs  # k records: need[k]
    k = max(0, int(np.searchsorted(need, len(into), side="right")) - 1)
    wanted, offs = wanted[:k], offs[: k + 1]
    head = np.frombuffer(into, np.int64, 2 + 2 * k + 1)
    head[:2] = k, offs[-1]
    head[2 : 2 + k] = wanted
    head[2 + k :] = offs
    at = HEAD + 16 * k + 8
    return wanted, offs, memoryview(into)[at : at + int(offs[-1])]


def read_entry(region: Any) -> Entry:
    """The entry `extract(..., into=region)` laid out (views of it, no copy)."""
    k, n = (int(v) for v in np.frombuffer(region, np.int64, 2))
    at = HEAD + 16 * k + 8
    if k < 0 or n < 0 or at + n > len(region):
        raise ValueError(f"a stash entry of {k} records, {n} bytes, in {len(region)} bytes")
    return (np.frombuffer(region, np.int64, k, HEAD),
            np.frombuffer(region, np.int64, k + 1, HEAD + 8 * k),
            memoryview(region)[at : at + n])


def _check(wanted: np.ndarray, n: int) -> None:
    if len(wanted) and (int(wanted[0]) < 0 or int(wanted[-1]) >= n):
        raise ArrayRecordFormatError(f"record {int(wanted[-1])} asked of a chunk of {n} "
                                     "records")


def slices(values: Any, bounds: np.ndarray, wanted: np.ndarray, into: Any) -> Entry:
    """Records `wanted` of decoded `values` (record j at `bounds[j]:bounds[j + 1]`) copied
    out, as `extract` gives them (into `into`, when given)."""
    wanted, offs, dst = _place(bounds, wanted, into)
    view = memoryview(values)
    b, o = bounds.tolist(), offs.tolist()
    for k, w in enumerate(wanted.tolist()):
        dst[o[k] : o[k + 1]] = view[b[w] : b[w + 1]]
    return wanted, offs, dst


def _streamed(values: Any, bounds: np.ndarray, wanted: np.ndarray, size: int,
              into: Any, sink: Any = None) -> Entry:
    """Decode the zstd values block piece by piece, copying out the wanted records (and
    every piece to `sink`, when given)."""
    declared, pos = read_varint(values, 0)
    stream = memoryview(values)[pos:]
    if declared != size:
        raise ArrayRecordFormatError(f"zstd block claims {declared} decoded bytes, header "
                                     f"says {size}")
    if size > _MAX_RATIO[ZSTD] * len(stream) + 64:
        raise ArrayRecordFormatError(f"zstd block of {len(stream)} bytes cannot decode to "
                                     f"{size} bytes")
    wanted, offs, dst = _place(bounds, wanted, into)
    s_list, e_list = bounds[wanted].tolist(), bounds[wanted + 1].tolist()
    o_list = offs.tolist()
    m, k, lo = len(s_list), 0, 0
    if sink is not None:
        sink.begin(bounds, size)
    try:
        for piece in _zstd_decompressor().read_to_iter(stream, read_size=PIECE // 4,
                                                       write_size=PIECE):
            if sink is not None:
                sink.piece(piece)
            if k == m:
                if sink is None or not sink.live:
                    break
                lo += len(piece)
                continue
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
    return wanted, offs, dst


class StashFile:
    """The parent's side of the stash: one memory file of `size` bytes that every worker
    maps (pages are taken only where entries are written: at most the horizon's records),
    cut afresh per horizon into one region per chunk (`regions`). A horizon is filled only
    once every task of the one before is done, so no region is written while read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._file: MemoryFile | None = None
        self.fills = 0  # horizons filled (`StashRef.serial`)
        self._closed = False

    @property
    def path(self) -> str:
        """The path workers open it by (made on first use; not once closed)."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        if self._file is None:
            self._file = MemoryFile("aioloader-stash", self.size, named=True)
        assert self._file.worker_path is not None  # (named: always a path)
        return self._file.worker_path

    def regions(self, estimates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Offsets and sizes of one region per chunk, in proportion to `estimates` (the
        bytes each chunk's entry should take) and together the whole file, so that each
        has the slack the horizon leaves; 64-byte aligned."""
        est = np.maximum(np.asarray(estimates, dtype=np.float64), 1.0)
        sizes = (est * (self.size / est.sum()) // 64).astype(np.int64) * 64
        offsets = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        return offsets, sizes

    def close(self) -> None:
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


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
