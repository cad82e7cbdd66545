"""Whether the shared stash (`runtime.horizons`) serves a source's chunks: a choice made
from the source's table, the pool and how a run of positions meets the chunks
(`index.chunkaccess`), kept apart from the horizons' lifecycle it decides."""

from __future__ import annotations

from typing import Any

from .. import formats as fmts
from ..index.blocks import BlockShuffle
from ..index.chunkaccess import everywhere, thrashes
from ..index.planning import ChunkRefs
from ..index.sampling import Shuffle
from ..workers.chunkcache import BOUND_BYTES

LARGE_CHUNK = 1 << 20  # mean decoded bytes a chunk from which horizons are worked out


class StashChoice:
    """For one task runner (`runtime.tasks.TaskRunner`): the stash's share of the cache, and
    whether it serves a horizon's positions."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self._share_mean: tuple[int, float] | None = None
        self._chunks: int | None = None  # the source's multi-record chunks (`multi`)

    def serves(self, head: ChunkRefs, mean: float, task: int) -> bool:
        """Whether the stash serves the positions of `head` (read by tasks of `task`
        records, of `mean` decoded bytes each): where one process's cache would decode a
        chunk again, or several would each decode it. A block shuffle's window that does
        not fit what a process keeps thrashes as an exact shuffle does (its records are
        shuffled together, so each task wants most of its chunks); a window that fits does
        not, nor a sequential read where formats keep their chunks themselves."""
        if self.order() == "sequential" and self.keeps_its_own():
            return False  # (chunks wanted one after another: the kept ones serve)
        return thrashes(head, self.kept(), mean + BOUND_BYTES, task) or self.shared(head, task)

    def order(self) -> str:
        """How the runner's positions go through the records: "exact" (a shuffle of them
        all), "block" (a block shuffle's windows) or "sequential" (no shuffle)."""
        ops = self.runner.plan.index.ops
        if any(isinstance(op, BlockShuffle) for op in ops):
            return "block"
        return "exact" if any(isinstance(op, Shuffle) for op in ops) else "sequential"

    def keeps_its_own(self) -> bool:
        """Whether every file's format keeps its decoded chunks itself, in less than the
        cache (`RecordFormat.kept_bytes`: Parquet's row groups)."""
        pool = self.runner.pool
        return all(fmts.get(k).kept_bytes(pool.pipeline.max_decoded) is not None
                   for k in set(self.runner.source.table.formats))

    def share(self) -> tuple[int, float]:
        """The decoded-chunk cache (all workers' together: the stash is shared), and the
        files' mean decoded record size; (0, 0) when chunks are small (under the formats'
        `stash_from`, at most `LARGE_CHUNK`, decoded on average: each task decodes its
        own, as before) or hold one record, or there are no files (from_source), or a
        file's format is not `stashable`."""
        got = self._share_mean
        if got is None:
            source = self.runner.source
            table = getattr(source, "table", None)
            got = (0, 0.0)
            if table is not None and table.max_group_size > 1 and len(source) and \
                    all(fmts.get(k).stashable for k in set(table.formats)):
                decoded = sum(int(ix.chunk_decoded_sizes.sum()) for ix in table.indices)
                kinds = set(table.formats)
                least = min(LARGE_CHUNK, max(fmts.get(k).stash_from for k in kinds))
                if decoded >= least * max(1, table.chunk_count):
                    got = (self.runner.pool.pipeline.chunk_cache_bytes,
                           decoded / len(source))
            self._share_mean = got
        return got

    def kept(self) -> int:
        """The decoded bytes of chunks each decoding process keeps: its share of the
        decoded-chunk cache, or less where a format keeps its chunks itself
        (`RecordFormat.kept_bytes`)."""
        pool = self.runner.pool
        if not getattr(pool, "stash_shared", True):  # (its workers may not read the stash)
            return pool.cache_bytes
        kept = [fmts.get(k).kept_bytes(pool.pipeline.max_decoded)
                for k in set(self.runner.source.table.formats)]
        return min([pool.cache_bytes] + [k for k in kept if k is not None])

    def shared(self, head: ChunkRefs, task: int) -> bool:
        """Whether the stash serves chunks that would not thrash a worker's cache: several
        processes decode tasks, every file's format would rather share one decode of a
        chunk than decode it in each (`RecordFormat.stash_shared`), and most tasks of
        `head` want most of the chunks, of which it meets most (an exact shuffle:
        `everywhere`), so that each process would decode nearly every chunk."""
        pool, table = self.runner.pool, self.runner.source.table
        if getattr(pool, "workers", 0) <= 1 or not getattr(pool, "stash_shared", True) or \
                not all(fmts.get(k).stash_shared for k in set(table.formats)):
            return False
        return everywhere(head, task, self.multi())

    def multi(self) -> int:
        """The multi-record chunks of all files (counted once)."""
        if self._chunks is None:
            self._chunks = sum(int((ix.chunk_records > 1).sum())
                               for ix in self.runner.source.table.indices)
        return self._chunks
