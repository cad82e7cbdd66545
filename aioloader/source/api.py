"""`ArrayRecordSource`: a set of record files (ArrayRecord, or any format of
`aioloader.formats`, each pattern its own) as one indexed record space, for users
(`formatsources` holds the same over TFRecord and Parquet files).

A thin facade over the two stages the loader uses directly: `table` (`RecordTable`, where each
record lies; built at open) and `fetcher` (`Fetcher`, bytes through merged range reads, the
memory copy, the raw chunk cache). What it adds is the user's view: records by global index,
decoded (`records`: each needed chunk decoded once, multi-record chunks kept decoded).

The sync API (`len`, `src[i]`, `with`) runs the same coroutines on the shared background
loop (`syncreads`), so it works in scripts and in notebooks that run their own loop; a record
of a local file asked for alone is read in the caller's thread instead (`direct`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .. import formats as fmts
from ..arrayrecord import DEFAULT_VERIFY, FileIndex
from ..cache import SegmentStore
from ..cache.indexdefault import index_cache_for
from ..elements.typed import ElementSpec, files_spec
from ..errors import ElementSpecError
from ..index.planning import CLOUD_MAX_GAP, DEFAULT_MAX_MERGED, LOCAL_MAX_GAP, ChunkRefs
from ..io.storage import Storage, is_local, redact
from ..logs import logger
from .direct import DirectReads
from .fetch import Fetcher, Lease
from .opening import open_table
from .reading import DecodedReads
from .records import ChunkCache
from .table import RecordTable

log = logger("source")


def _kinds(values: list[str]) -> str:
    """`["zstd:3"] * 19 + ["none"]` -> "zstd:3 (19 files), none (1 file)"; one kind: itself."""
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return values[0]
    return ", ".join(f"{k} ({n} file{'s' if n > 1 else ''})" for k, n in sorted(counts.items()))


def describe_table(table: RecordTable) -> tuple[str, int, int, float, str, str]:
    """What the INFO line at open says: (where, files, records, bytes, codecs, group sizes)."""
    codecs, groups = [], []
    for ix, kind in zip(table.indices, table.formats):
        codec = fmts.get(kind).codec(ix)
        name = fmts.base(kind)
        codecs.append(codec if name == fmts.ARRAYRECORD or codec == name
                      else f"{name} ({codec})")
        groups.append(str(ix.group_size))
    urls = table.urls
    where = redact(urls[0] if len(urls) == 1 else f"{urls[0]} .. {urls[-1]}") if urls else "-"
    return (where, len(urls), len(table), sum(f.size for f in table.files) / 1e6,
            _kinds(codecs), _kinds(groups))


class ArrayRecordSource(DecodedReads):
    """Random access to the records of one or more ArrayRecord files.

    `paths` is a path or URL, a glob (`gs://bucket/train-*.array_record`), or a list of them;
    records are numbered across files in that order (globs sorted). A name ending in
    `[start:end]` (array_record's and Grain's read instruction) is that file's records
    start..end-1, unless a file of that literal name exists (then it is read whole).
    With `resident_bytes` (off by default here; the loader's default is 1 GiB) a remote
    dataset is fetched in segments after the first read and kept in memory, whole when it
    fits (`aioloader.cache`).
    `cache_bytes` bounds each chunk cache: the decoded chunks `read` keeps, and the raw
    chunks `fetch_refs` keeps (files with group size > 1 only). `verify` ("all") says which
    stored hashes each read checks: "all" of them, chunk data included, as Google's reader
    does; "headers" skips the data hashes (a damaged record is then returned as it is);
    "none" checks none.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        storage_options: Mapping[str, Any] | None = None,
        verify: str = DEFAULT_VERIFY,
        storage: Storage | None = None,
        cache_bytes: int = 256 << 20,
        max_gap: int | None = None,
        max_merged: int = DEFAULT_MAX_MERGED,
        index_cache_dir: str | os.PathLike | Literal[False] | None = "auto",
        resident_bytes: int = 0,
        format: str | Sequence[str] = fmts.ARRAYRECORD,
    ) -> None:
        self._patterns = ([os.fspath(paths)] if isinstance(paths, (str, os.PathLike))
                          else [os.fspath(p) for p in paths])
        if not self._patterns:
            raise ValueError(f"{type(self).__name__} needs at least one path")
        # Each pattern's record format (`aioloader.formats`): one for all, or one each.
        self.formats = ([format] * len(self._patterns) if isinstance(format, str)
                        else list(format))
        if len(self.formats) != len(self._patterns):
            raise ValueError(f"format names {len(self.formats)} formats for "
                             f"{len(self._patterns)} paths: give one, or one per path")
        for kind in self.formats:
            fmts.check(kind)
        self.verify = verify
        self._owns_storage = storage is None
        self.storage = storage or Storage(storage_options=storage_options)
        self.cache_bytes = cache_bytes
        self.cache = ChunkCache(cache_bytes)
        local = all(is_local(p) for p in self._patterns)
        self.max_gap = max_gap if max_gap is not None else (LOCAL_MAX_GAP if local
                                                             else CLOUD_MAX_GAP)
        # A merged read must fit the byte budget with room for others in flight.
        self.max_merged = max(1, min(max_merged, self.storage.max_inflight_bytes // 4))
        # (a copy in another process resolves "auto" again, with the same result)
        self._index_cache = index_cache_for(index_cache_dir, self._patterns)
        self.index_cache_dir = (self._index_cache.directory if self._index_cache is not None
                                else None)
        self.resident_bytes = resident_bytes
        # What a copy in another process opens again (see __getstate__): no event loop,
        # session or open file travels.
        self._config: dict[str, Any]
        self._config = dict(paths=self._patterns, storage_options=self.storage.storage_options,
                            verify=verify, cache_bytes=cache_bytes, max_gap=max_gap,
                            max_merged=max_merged,
                            index_cache_dir=(os.fspath(index_cache_dir) if index_cache_dir
                                             else None),
                            resident_bytes=resident_bytes, format=format)
        self._table: RecordTable | None = None
        self._fetcher: Fetcher | None = None
        self._direct: DirectReads | None = None  # `src[i]` without the loop (see `direct`)
        self._open_lock: asyncio.Lock | None = None
        self._used_sync = False

    # -- opening ----------------------------------------------------------------------

    @classmethod
    async def open(cls, paths, **kw: Any) -> ArrayRecordSource:
        """Create and open a source from async code."""
        src = cls(paths, **kw)
        try:
            await src.aopen()
        except BaseException:
            await src.aclose()
            raise
        return src

    async def aopen(self) -> None:
        """List and index every file (idempotent)."""
        if self._table is not None:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._table is None:
                t0 = time.perf_counter()
                table = await open_table(self._patterns, self.storage, verify=self.verify,
                                         index_cache=self._index_cache, formats=self.formats)
                if log.isEnabledFor(logging.INFO):
                    log.info("opened %s: %d files, %d records, %.1f MB; codec %s, group "
                             "size %s (%.2f s)", *describe_table(table),
                             time.perf_counter() - t0)
                self._fetcher = Fetcher(self.storage, table, max_gap=self.max_gap,
                                        max_merged=self.max_merged,
                                        resident_bytes=self.resident_bytes,
                                        cache_bytes=self.cache_bytes)
                self._direct = DirectReads(table, self.cache, verify=self.verify,
                                           max_decoded=self.storage.max_inflight_bytes,
                                           check_budget=self.storage.check_budget)
                self._table = table

    def _require_open(self) -> None:
        if self._table is None:
            try:
                self._sync(self.aopen())
            except BaseException:
                self.close()
                raise

    # -- the stages -------------------------------------------------------------------

    @property
    def table(self) -> RecordTable:
        """Where every record lies: the files, their indices, the chunk table."""
        self._require_open()
        return self._table  # type: ignore[return-value]

    @property
    def fetcher(self) -> Fetcher:
        """The fetch stage: merged reads, the memory copy, the raw chunk cache."""
        self._require_open()
        return self._fetcher  # type: ignore[return-value]

    @property
    def opened(self) -> bool:
        """Whether the files are open (a failed open leaves it False)."""
        return self._table is not None

    @property
    def resident(self) -> SegmentStore | None:
        """The memory tier of a remote dataset, if kept (see aioloader.cache.segments)."""
        return self._fetcher.resident if self._fetcher is not None else None

    # -- what is open -----------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return self.table.urls

    @property
    def file_indices(self) -> list[FileIndex]:
        return self.table.indices

    def __len__(self) -> int:
        return len(self.table)

    @property
    def element_spec(self) -> ElementSpec | None:
        """What each record holds, as the files' writer recorded it (`aioloader.elements.typed`), or
        None; ElementSpecError if the files disagree or one is malformed."""
        return files_spec([(redact(u), ix.element_spec)
                           for u, ix in zip(self.urls, self.file_indices)])

    @property
    def chunk_starts(self) -> np.ndarray:
        """Global index of the first record of every chunk of every file, plus the total."""
        return self.table.chunk_starts

    @property
    def max_group_size(self) -> int:
        return self.table.max_group_size

    @property
    def all_local(self) -> bool:
        """Every file is on a local disk (workers may then read records themselves)."""
        return self.table.all_local

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global record indices → (file, chunk, index within chunk), vectorized."""
        return self.table.locate(indices)

    def chunk_refs(self, indices) -> ChunkRefs:
        """Where each record's chunk lies: what a worker needs to read and decode it (a
        chunk over the byte budget is refused here, as reading it would be)."""
        refs = self.table.chunk_refs(indices)
        self.fetcher.check_budget(refs)
        return refs

    # -- fetching (the loader's calls; see Fetcher) -----------------------------------

    async def fetch_refs(self, refs: ChunkRefs) -> list[memoryview]:
        """The physical bytes of each record's chunk in `refs` (merged reads)."""
        return await self.fetcher.fetch_refs(refs)

    async def resident_refs(self, refs: ChunkRefs) -> Lease | None:
        """`refs` read from the memory tier, pinned there until the lease is released,
        when it serves them (see `Fetcher.resident_refs`)."""
        return await self.fetcher.resident_refs(refs)

    # -- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release this loop's I/O resources (call from the loop you read on)."""
        if self._fetcher is not None:  # read again: record by record, from storage
            await self._fetcher.aclose()
        if self._direct is not None:
            self._direct.close()
        if self._owns_storage:
            await self.storage.aclose()

    async def __aenter__(self) -> ArrayRecordSource:
        try:
            await self.aopen()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        t = self._table
        state = f"{len(t.urls)} files, {len(t):,} records" if t is not None else "not opened"
        more = ", ..." if len(self._patterns) > 1 else ""
        selections = {fmts.split(k)[1] for k in self.formats}
        if len(selections) == 1 and None not in selections:
            more += f", columns={list(selections.pop() or ())!r}"
        return f"{type(self).__name__}({redact(self._patterns[0])!r}{more}; {state})"


def recorded_spec(paths: Sequence[str], storage_options: Any = None,
                  verify: str = DEFAULT_VERIFY) -> ElementSpec:
    """The element spec that the files at `paths` record (one open of their footers);
    ElementSpecError if they record none or disagree (`decode="auto"`)."""
    with ArrayRecordSource(list(paths), storage_options=dict(storage_options or {}),
                           verify=verify) as src:
        spec = src.element_spec
    if spec is None:
        raise ElementSpecError(
            f"decode='auto': {', '.join(map(redact, paths))} record no element spec (write "
            "them with convert --from npy or --decode-examples, or ArrayRecordWriter("
            "element_spec=...)); or pass decode=ElementSpec(...)")
    return spec
