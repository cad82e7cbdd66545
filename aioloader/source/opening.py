"""Opening: list the files, read and parse every file's footer, build the `RecordTable`.

Each pattern names files of one record format (`aioloader.formats`; ArrayRecord unless
said): a file's index is whatever its format's `open_index` reads (ArrayRecord: its footer,
as below; TFRecord: one sequential scan of the whole file), driven here the same way.

Opening lists the files (one listing for a glob), then reads every file's footer, all files
in parallel: local files in a few batched thread-pool jobs, by small reads of what they
declare (the postscript's head, then the footer); remote files, as many in flight as the
storage allows, by one speculative read each of the footer's likely span and the
postscript's head: any footer of up to 64 KiB, or the largest footer seen so far if it was
larger, wherever its padding ends (a footer that does not fit costs one more read). A
gs:// file named without a glob takes one request (a suffix-range GET also gives its size
and generation). With an index cache, the listing is followed by
one mapped table instead (`index_cache`: no request a file where the listing gives each
object's generation). Each file is pinned to the version first seen, so a rewrite
shows up as an error, not as other records.

A name ending in a read instruction, `path[start:end]` (array_record's and Grain's syntax,
which TFDS's file instructions use too), opens `path` and takes its records start..end-1
(`RecordTable`'s `ranges`), unless a file of that literal name exists: then that file is read
whole, never taken as a glob. Telling the two apart costs one request per such name.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from .. import formats as fmts
from ..arrayrecord import FileIndex
from ..arrayrecord.index import POSTSCRIPT_PROBE
from ..arrayrecord.layout import BLOCK_SIZE
from ..cache.index_cache import HEAD_BYTES, IndexCache, checked
from ..io.storage import ObjectInfo, Storage, has_glob, is_local, redact
from ..urls import read_instruction
from .table import RecordTable

# A remote file's one speculative read: this much before its postscript (with the
# postscript's head). A footer chunk is followed by padding to the next 64 KiB boundary at
# least a chunk header on, so a footer of f bytes and its padding take less than
# f + BLOCK_SIZE + PAD_SLACK: FIRST_SPAN holds any footer of up to 64 KiB wherever it ends.
# Once files are open, later files' reads are sized to hold the largest footer seen
# wherever it ends (`_Opener.learn`), up to CLOUD_SPAN, and never less than FIRST_SPAN: the
# open of many files from a bucket is bound by requests more than bytes, and a read
# narrowed to small footers seen would cost a second request for every later file whose
# footer is larger (footers that grow from file to file).
FIRST_SPAN = 2 * BLOCK_SIZE
PAD_SLACK = 128  # the padding chunk's header (40 bytes) and a block header (24) inside it
CLOUD_SPAN = 1 << 20  # the most learned: footers of up to ~300k chunks in one round trip


async def gather_all(coros) -> list[Any]:
    """`asyncio.gather`, but the first failure cancels and awaits the rest, so none is still
    running (and using the storage being closed) when the error reaches the caller."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def open_table(patterns: Sequence[str], storage: Storage, *, verify: str,
                     index_cache: IndexCache | None,
                     formats: Sequence[str] | None = None) -> RecordTable:
    """List and index the files `patterns` name, in order, all at once; `formats[k]` is
    the record format of pattern k's files (default: all ArrayRecord). With an index
    cache: list, then map the files' cached table, or index them and store it."""
    kinds = list(formats) if formats is not None else [fmts.ARRAYRECORD] * len(patterns)
    if len(kinds) != len(patterns):
        raise ValueError("formats must name one format per pattern")
    opener = _Opener(storage, verify)
    names = await gather_all(opener.resolve(p) for p in patterns)
    if index_cache is not None:
        listed = await gather_all(opener.list_pattern(p, glob) for p, glob, _ in names)
        infos = [i for group in listed for i in group]
        kinds = [k for k, group in zip(kinds, listed) for _ in group]
        ranges = _ranges(names, listed)
        cached = index_cache.load(infos, kinds)
        if cached is not None:
            if np.array_equal(await footer_heads(storage, infos, cached.indices, kinds),
                              cached.heads):
                table = RecordTable(infos, cached.indices, cached.bounds, ranges=ranges,
                                    formats=kinds)
                table.pattern_files = [len(g) for g in listed]
                table.from_index_cache = True
                return table
            index_cache.drop(infos, "a file's footer is not the one it holds (the file was "
                                    "rewritten, its size and mtime kept)", kinds)
        indices = await opener.open_files(infos, kinds)
        index_cache.store(infos, indices, await footer_heads(storage, infos, indices, kinds),
                          kinds)
        table = RecordTable(infos, indices, ranges=ranges, formats=kinds)
        table.pattern_files = [len(g) for g in listed]
        return await _trimmed(table)
    groups = await gather_all(opener.open_pattern(p, glob, kind)
                              for (p, glob, _), kind in zip(names, kinds))
    table = RecordTable([info for group in groups for info, _ in group],
                        [index for group in groups for _, index in group],
                        ranges=_ranges(names, groups),
                        formats=[k for k, group in zip(kinds, groups) for _ in group])
    table.pattern_files = [len(g) for g in groups]
    del groups  # the parsed columns, now copied into the table: free them before trimming
    return await _trimmed(table)


def _ranges(names: list[tuple[str, bool, tuple[int, int] | None]],
            groups: Sequence[Sequence[Any]]) -> list[tuple[int, int] | None] | None:
    """The record range each opened file is read over (None: all of it), or None when no
    name was a read instruction."""
    if all(r is None for _, _, r in names):
        return None
    return [r for (_, _, r), group in zip(names, groups) for _ in group]


async def footer_changed(storage: Storage, info: ObjectInfo, index: FileIndex,
                         verify: str, kind: str = fmts.ARRAYRECORD) -> bool:
    """Whether the file's footer (its index, of format `kind`), read again now, gives
    another index than `index` (False when it cannot be read: nothing is known then)."""
    try:
        now = await _Opener(storage, verify)._open_file(info, kind)
    except Exception:
        return False
    return not (now.footer_offset == index.footer_offset
                and np.array_equal(now.chunk_offsets, index.chunk_offsets)
                and np.array_equal(now.chunk_records, index.chunk_records)
                and np.array_equal(now.chunk_decoded_sizes, index.chunk_decoded_sizes))


async def footer_heads(storage: Storage, infos: Sequence[ObjectInfo],
                       indices: Sequence[FileIndex], kinds: Sequence[str]) -> np.ndarray:
    """Each file's first HEAD_BYTES bytes at its format's proof offset (ArrayRecord: its
    footer's) where the index cache checks them (`index_cache.checked`: one small read per
    local file), else zeros."""
    out = np.zeros((len(infos), HEAD_BYTES), dtype=np.uint8)
    ks = [k for k, info in enumerate(infos) if checked(info)]
    at = [fmts.get(kinds[k]).proof_offset(indices[k]) for k in ks]
    # (cut at the file's end: a file may be shorter than HEAD_BYTES, or empty)
    datas = await storage.read_many([(infos[k].url, a, min(a + HEAD_BYTES, infos[k].size))
                                     for k, a in zip(ks, at)])
    for k, data in zip(ks, datas):
        out[k, : len(data)] = np.frombuffer(data, dtype=np.uint8)[:HEAD_BYTES]
    return out


async def _trimmed(table: RecordTable) -> RecordTable:
    """`table`, after giving the heap's free memory back to the system (glibc only).

    Parsing footers frees per-file columns (copied into the table, narrowed, or found to
    be all ones) of ~100 KB–40 MB each; glibc's growing mmap threshold keeps such blocks in
    the heap, which left ~8 bytes per record of freed memory in RSS after a 5M-record open.
    """
    if _malloc_trim is not None and table.chunk_count > 100_000:
        await asyncio.sleep(0)  # finished tasks' callbacks still hold their results
        _malloc_trim(0)
    return table


def _find_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, ImportError):  # not glibc: nothing to do
        return None


_malloc_trim = _find_malloc_trim() if sys.platform.startswith("linux") else None


class _Opener:
    """Reads files' tails into footer indices through one storage."""

    def __init__(self, storage: Storage, verify: str) -> None:
        self.storage = storage
        self.verify = verify
        # how much before a remote file's postscript to read first: FIRST_SPAN until a
        # file is open, then what the largest footer seen needs (`learn`)
        self.span: int | None = None

    def _span(self) -> int:
        """`span`, within the byte budget."""
        span = FIRST_SPAN if self.span is None else self.span
        return max(0, min(span, self.storage.max_inflight_bytes - POSTSCRIPT_PROBE))

    def learn(self, index: FileIndex) -> None:
        """Size later files' first reads to hold a footer as large as this one's, wherever
        its padding ends, and never less than FIRST_SPAN: by the footer's own bytes where
        the format says them (`footer_need`), else by the footer and its padding together
        (an overestimate by the padding; an index without a footer, as a scanned TFRecord
        file's, takes none)."""
        need = vars(index).get("footer_need")
        if need is not None:
            fit = need + BLOCK_SIZE + PAD_SLACK
        else:  # (an overestimate: it only ever widens the first read)
            took = index.size - BLOCK_SIZE - index.footer_offset
            if took <= 0:
                return
            fit = max(FIRST_SPAN, took + BLOCK_SIZE + PAD_SLACK)
        fit = min(CLOUD_SPAN, max(FIRST_SPAN, fit))
        self.span = fit if self.span is None else max(self.span, fit)

    async def resolve(self, pattern: str) -> tuple[str, bool, tuple[int, int] | None]:
        """What `pattern` names: (the path to open, whether it is a glob, the records
        `[start, end)` a read instruction takes of it or None for all of them)."""
        parsed = read_instruction(pattern)
        if parsed is None:
            return pattern, has_glob(pattern), None
        try:  # (a 1-byte tail: one GET on gs://, where a metadata lookup takes ~3)
            await self.storage.read_tail(pattern, 1)
            return pattern, False, None  # a file of that very name: it wins, read whole
        except FileNotFoundError:
            pass
        path, start, end = parsed
        if has_glob(path):
            raise ValueError(f"{redact(pattern)}: a read instruction [start:end] takes "
                             "records of one file, not of a glob; name the file")
        if start > end:
            raise ValueError(f"{redact(pattern)}: the read instruction [{start}:{end}] ends "
                             "before it starts (records start..end-1 are read)")
        return path, False, (start, end)

    async def list_pattern(self, pattern: str, glob: bool) -> list[ObjectInfo]:
        """The files `pattern` names, pinned: a listing for a glob, a lookup for a name."""
        if glob:
            return await self._list(pattern)
        info = await self.storage.info(pattern)
        self.storage.pin(info)
        return [info]

    async def open_pattern(self, pattern: str, glob: bool,
                           kind: str = fmts.ARRAYRECORD) -> list[tuple[ObjectInfo, FileIndex]]:
        """Open the files `pattern` names, in order, each pinned to the version first seen.

        A glob is one listing (sizes and generations included), then one tail read per file.
        A single name is one request on gs:// (a suffix-range GET gives size, generation and
        tail together), and a size lookup then a tail read elsewhere; its tail is parsed as
        soon as it arrives, so thousands of named files never hold their tails all at once.
        """
        if glob:
            files = await self._list(pattern)
            return list(zip(files, await self.open_files(files, [kind] * len(files))))
        span = self._span()  # the same for the suffix GET and the parse: one request
        info, tail = await self.storage.read_tail(pattern, BLOCK_SIZE + span)
        self.storage.pin(info)
        return [(info, await self._open_file(info, kind, tail, span))]

    async def open_files(self, files: list[ObjectInfo],
                         kinds: Sequence[str]) -> list[FileIndex]:
        """Index many files at once. Remote files: as many tail reads in flight as the
        storage allows, each parsed as it lands (`_open_remote`). Local files: every
        parser's next read goes out in one `read_many` (a few batched thread-pool jobs, not
        a hop per file), in waves that fit the byte budget."""
        local = [k for k, info in enumerate(files) if is_local(info.url)]
        out: list[FileIndex | None] = [None] * len(files)
        if len(local) < len(files):
            remote = [k for k in range(len(files)) if not is_local(files[k].url)]
            for k, index in zip(remote, await self._open_remote([files[k] for k in remote],
                                                                [kinds[k] for k in remote])):
                out[k] = index
        steps: dict[int, Generator[tuple[int, int], bytes | memoryview, FileIndex]] = {}
        wanted: dict[int, tuple[int, int]] = {}
        for k in local:
            info = files[k]
            steps[k] = fmts.get(kinds[k]).open_index(
                info.size, path=redact(info.url), verify=self.verify,
                max_decoded=self.storage.max_inflight_bytes, local=True)
            try:
                wanted[k] = next(steps[k])
            except StopIteration as done:  # an index that needs no read (an empty file)
                out[k] = done.value
        wave_bytes = max(1, self.storage.max_inflight_bytes // 2)
        while wanted:
            keys: list[int] = []
            total = 0
            for k, (_, length) in wanted.items():
                if keys and total + length > wave_bytes:
                    break
                keys.append(k)
                total += length
            datas = await self.storage.read_many(
                [(files[k].url, wanted[k][0], wanted[k][0] + wanted[k][1]) for k in keys])
            for k, data in zip(keys, datas):
                try:
                    wanted[k] = steps[k].send(data)
                except StopIteration as done:
                    del wanted[k]
                    out[k] = done.value
        return out  # type: ignore[return-value]

    async def _open_remote(self, files: list[ObjectInfo],
                           kinds: Sequence[str]) -> list[FileIndex]:
        """Index remote files, at most `storage.limit` at once: that many tasks take the next
        file as each finishes. Handing the storage every tail at once would queue the rest
        on its slots, and a read's deadline runs from when it is issued: opening thousands
        of files from a slow bucket failed so, each read timed out waiting behind the others.
        """
        out: list[FileIndex | None] = [None] * len(files)
        todo = iter(range(len(files)))

        async def opener() -> None:
            for k in todo:  # shared: each file is taken by one task
                out[k] = await self._open_file(files[k], kinds[k])

        await gather_all(opener() for _ in range(min(len(files), max(1, self.storage.limit))))
        return out  # type: ignore[return-value]

    async def _list(self, pattern: str) -> list[ObjectInfo]:
        """The files a glob matches, pinned; no per-file lookups (the listing has it all)."""
        found = await self.storage.glob(pattern)
        if not found:
            raise FileNotFoundError(
                f"no files match {redact(pattern)!r} (check the path and pattern)"
            )
        for info in found:
            self.storage.pin(info)
        return found

    async def _open_file(self, info: ObjectInfo, kind: str = fmts.ARRAYRECORD,
                         tail: bytes | None = None, span: int | None = None) -> FileIndex:
        """Index one file of format `kind`; `tail`, when given, is its last `len(tail)`
        bytes, already read. ArrayRecord: a local file by small reads; a remote one by one
        read of its footer's likely span (`span`, default `_span()`) and its postscript's
        head (`open_index`'s `span`), learning from each file."""
        local = is_local(info.url)
        fmt = fmts.get(kind)
        steps = fmt.open_index(info.size, path=redact(info.url), verify=self.verify,
                               max_decoded=self.storage.max_inflight_bytes, local=local,
                               span=None if local else span if span is not None
                               else self._span())
        tail_at = info.size - len(tail) if tail is not None else info.size
        try:
            offset, length = next(steps)
            while True:
                if tail is not None and tail_at <= offset and offset + length <= info.size:
                    data = (tail if length == len(tail) else
                            memoryview(tail)[offset - tail_at : offset - tail_at + length])
                else:
                    data = await self.storage.read(info.url, offset, offset + length)
                offset, length = steps.send(data)
        except StopIteration as done:
            if not local:
                self.learn(done.value)
            return done.value
