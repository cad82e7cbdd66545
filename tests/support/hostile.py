"""Crafted ArrayRecord files that lie with valid hashes: the hostile-file generator.

A damaged file is easy to reject: its hashes fail. A crafted one is not: every block, header
and data hash agrees, but a declared size, count or offset lies (a 1 TiB decoded size in a
128 KiB file, a footer count that disagrees with its chunk, a codec stream that decodes short
or long). `craft` builds such files from the project's own writer pieces (layout, proto,
codecs, hashing); `make_case(seed, i)` picks one lie deterministically. tests/support/hostile_run.py
reads them every way the loader does and runs many in a child under memory limits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import zstandard

from aioloader.arrayrecord.codecs import BROTLI, NONE, SNAPPY, ZSTD, Compression
from aioloader.arrayrecord.hashing import highwayhash64
from aioloader.arrayrecord.layout import (
    BLOCK_HEADER_SIZE,
    BLOCK_SIZE,
    CHUNK_SIMPLE,
    CHUNK_TRANSPOSED,
    ChunkHeader,
    add_with_overhead,
    padding_chunk,
    physical_pieces,
    strip_block_headers,
)
from aioloader.arrayrecord.proto import (
    encode_footer_entry,
    encode_metadata,
    encode_postscript,
)
from aioloader.arrayrecord.varint import encode_varint, encode_varints
from aioloader.arrayrecord.writer import SIGNATURE

CODECS = (NONE, ZSTD, BROTLI, SNAPPY)
GROUPS = (1, 2, 3, 8)
LEVEL = {NONE: None, ZSTD: 3, BROTLI: 5, SNAPPY: None}


# -- building files -----------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """One chunk as it will be stored: its data, and what its header claims."""

    data: bytes
    num_records: int  # the header's claim
    decoded_size: int  # the header's claim
    span: int  # records the layout reserves bytes for (Riegeli's "at least num_records")
    chunk_type: int = CHUNK_SIMPLE
    data_size: int | None = None  # the header's claim; None: len(data)


def stream(codec: int, payload: bytes, content_size: bool = True) -> bytes:
    """`payload` compressed with `codec`, as a simple chunk's block holds it after the prefix."""
    if codec == ZSTD and not content_size:
        return zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    return Compression(codec, LEVEL[codec])._compress_parts(payload)[1]


def block(codec: int, payload: bytes, prefix: int | None = None, content_size: bool = True):
    """One block of a simple chunk; `prefix` (the decoded length it declares) may lie."""
    if codec == NONE:
        return payload
    return encode_varint(len(payload) if prefix is None else prefix) + stream(
        codec, payload, content_size)


def chunk_from(sizes: bytes, values: bytes, count: int, codec: int, *,
               decoded: int | None = None, edit: Callable | None = None,
               sizes_prefix: int | None = None, values_prefix: int | None = None,
               sizes_len: int | None = None, content_size: bool = True) -> Chunk:
    """A simple chunk of `count` records (`sizes` varints, `values` bytes); `decoded`
    (default `len(values)`) is what its header claims. The keyword arguments lie: `edit`
    changes the values the stream decodes to, the others replace a declared length."""
    sb = block(codec, sizes, sizes_prefix, content_size)
    stored = edit(values) if edit else values
    vb = block(codec, stored, values_prefix, content_size)
    data = bytes([codec]) + encode_varint(len(sb) if sizes_len is None else sizes_len) + sb + vb
    return Chunk(data, count, len(values) if decoded is None else decoded, span=count)


def simple_chunk(records: list[bytes], codec: int, *, sizes: bytes | None = None,
                 count: int | None = None, **kw) -> Chunk:
    """A simple chunk of `records`; `sizes`, `count` and `kw` (see `chunk_from`) lie."""
    sizes = encode_varints([len(r) for r in records]) if sizes is None else sizes
    n = len(records) if count is None else count
    return chunk_from(sizes, b"".join(records), n, codec, **kw)


def _phys(begin: int, k: int) -> int:
    """Physical position of logical byte `k` of the chunk that begins at `begin`."""
    q = add_with_overhead(begin, k)
    return q + BLOCK_HEADER_SIZE if q % BLOCK_SIZE == 0 else q


def _place(out: bytearray, chunk: Chunk) -> int:
    begin = len(out)
    out += b"".join(physical_pieces(begin, (bytes(40), chunk.data), chunk.span))
    return begin


def _seal(out: bytearray, begin: int, chunk: Chunk) -> None:
    """Write the chunk's header, with both hashes valid for the bytes a reader will see."""
    size = len(chunk.data) if chunk.data_size is None else chunk.data_size
    lo, hi = _phys(begin, 40), add_with_overhead(begin, 40 + size)
    data = (strip_block_headers(bytes(out[lo:hi]), lo, verify=False) if hi <= len(out)
            else chunk.data)
    header = ChunkHeader(size, highwayhash64(bytes(data)), chunk.chunk_type,
                         chunk.num_records, chunk.decoded_size).pack()
    for k in range(40):
        out[_phys(begin, k)] = header[k]


def craft(chunks: list[Chunk], *, codec: int = ZSTD, options: str = "group_size:1",
          entries: Callable | None = None, entry_parts: tuple[bytes, int] | None = None,
          meta: Callable | None = None, footer_kw: dict | None = None,
          footer: Callable | None = None, footer_offset: Callable | None = None,
          post_codec: int = NONE, post_kw: dict | None = None,
          postscript: Callable | None = None) -> bytes:
    """A whole file: signature, `chunks`, footer, postscript; every hash valid.

    Lies: `entries(list of (offset, decoded, count)) -> list`; `entry_parts = (entry, n)`
    replaces the entries with `n` copies of one encoded entry (cheap for millions);
    `meta(num_chunks, num_records) -> (num_chunks, num_records)`; `footer_kw` / `post_kw`
    (see `chunk_from`) for the footer's and postscript's blocks; `footer(Chunk) -> Chunk`
    and `postscript(Chunk) -> Chunk` for their headers; `footer_offset(offset) -> offset`.
    """
    out = bytearray(SIGNATURE)
    placed = []
    truth = []
    for ch in chunks:
        begin = _place(out, ch)
        placed.append((begin, ch))
        truth.append((begin, ch.decoded_size, ch.span))
    ents = entries(truth) if entries else truth
    if entry_parts is None:
        n_chunks, n_records = len(ents), sum(e[2] for e in ents) % 2**64
        bodies = [encode_footer_entry(*(v % 2**64 for v in e)) for e in ents]
        sizes, values = encode_varints([len(b) for b in bodies]), b"".join(bodies)
    else:
        entry, n_chunks = entry_parts
        n_records = n_chunks
        sizes, values = encode_varint(len(entry)) * n_chunks, entry * n_chunks
    count = n_chunks + 1
    if meta:
        n_chunks, n_records = meta(n_chunks, n_records)
    head = encode_metadata(n_chunks % 2**64, n_records % 2**64, options)
    fch = chunk_from(encode_varint(len(head)) + sizes, head + values, count, codec,
                     **(footer_kw or {}))
    if entry_parts is not None:
        fch = replace(fch, span=0)  # a small file that claims millions of entries
    fch = footer(fch) if footer else fch
    at = _place(out, fch)
    placed.append((at, fch))
    out += padding_chunk(len(out))
    offset = footer_offset(at) if footer_offset else at
    post = simple_chunk([encode_postscript(offset % 2**64)] * 3, post_codec, **(post_kw or {}))
    post = postscript(post) if postscript else post
    placed.append((_place(out, post), post))
    out += padding_chunk(len(out))
    for begin, ch in reversed(placed):  # later chunks first: a lying data_size may cover them
        _seal(out, begin, ch)
    return bytes(out)


def grouped(records: list[bytes], group: int) -> list[list[bytes]]:
    return [records[k : k + group] for k in range(0, len(records), group)]


def honest(records: list[bytes], codec: int, group: int, **kw) -> bytes:
    """The file our writer would make (up to compression details): the control case."""
    chunks = [simple_chunk(g, codec) for g in grouped(records, group)]
    return craft(chunks, codec=codec, options=_options(codec, group), **kw)


def _options(codec: int, group: int) -> str:
    name = Compression(codec, LEVEL[codec]).name
    return f"group_size:{group},{name}" + (f":{LEVEL[codec]}" if LEVEL[codec] else "")


# -- the lies ------------------------------------------------------------------------------


BIG = (2**20, 2**30 + 1, 2**40, 2**56 - 1, 2**63, 2**64 - 1)


def lie(rng: random.Random, true: int, cap: int = 2**64 - 1) -> int:
    """A value that is probably not `true`: near it, zero, or huge."""
    pick = rng.choice((true + 1, max(0, true - 1), 0, 1, 2 * true + 7,
                       rng.randrange(true + 3), true + rng.randrange(1, 5000), *BIG))
    return min(pick, cap)


@dataclass
class Case:
    seed: int
    index: int
    kind: str
    detail: str
    codec: int
    group: int
    verify: str
    records: list[bytes]
    data: bytes

    def __str__(self) -> str:
        return (f"seed {self.seed} case {self.index}: {self.kind} ({self.detail}), "
                f"codec {Compression(self.codec).name}, group {self.group}, verify "
                f"{self.verify}; rerun: python -m tests.support.hostile_run case "
                f"{self.seed} {self.index}")


def _records(rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(rng.randint(1, 12)):
        n = rng.choice((0, 1, 7, rng.randrange(300), rng.randrange(3000),
                        rng.randrange(3000), rng.randrange(80_000)))  # some cross blocks
        out.append(rng.choice((bytes([rng.randrange(256)]) * n, rng.randbytes(n),
                               (rng.randbytes(8) * (n // 8 + 1))[:n])))
    return out


def _chunk_lie(rng: random.Random, ch: Chunk, what: str) -> tuple[Chunk, str]:
    if what == "decoded":
        v = lie(rng, ch.decoded_size)
        return replace(ch, decoded_size=v), f"decoded_data_size {v}"
    if what == "count":
        v = lie(rng, ch.num_records, 2**56 - 1)
        return replace(ch, num_records=v), f"num_records {v}"
    if what == "data_size":
        v = lie(rng, len(ch.data))
        return replace(ch, data_size=v), f"data_size {v}"
    v = rng.choice((CHUNK_TRANSPOSED, ord("p"), ord("m"), 0, 0xFF))
    return replace(ch, chunk_type=v), f"chunk type {v:#x}"


def _stream_kw(rng: random.Random, n: int, decoded: int, codec: int) -> tuple[dict, str]:
    """Keyword lies for `chunk_from`: a block of a chunk with `n` records and `decoded`
    values bytes that decodes short or long, or whose declared lengths lie."""
    what = rng.choice(("short", "long", "bomb", "prefix", "both", "sizes_prefix",
                       "sizes_len", "no_content_size"))
    kw: dict = {}
    if what == "short":
        cut = rng.randint(1, max(1, decoded))
        kw["edit"] = lambda v, cut=cut: v[:-cut]
    elif what == "long":
        extra = rng.randbytes(rng.randint(1, 3000))
        kw["edit"] = lambda v, extra=extra: v + extra
    elif what == "bomb":  # decodes to megabytes more than declared
        extra = rng.choice((1 << 16, 1 << 20, 16 << 20)) if codec != NONE else 70_000
        kw["edit"] = lambda v, extra=extra: v + bytes(extra)
    elif what == "prefix":
        kw["values_prefix"] = lie(rng, decoded)
    elif what == "both":  # the header agrees with the lying prefix
        kw["decoded"] = kw["values_prefix"] = lie(rng, decoded)
    elif what == "sizes_prefix":
        kw["sizes_prefix"] = lie(rng, n)
    elif what == "sizes_len":
        kw["sizes_len"] = lie(rng, n + 3)
    else:  # zstd frames without their own content size; other codecs: the header lies
        kw["content_size"] = False
        kw["decoded"] = kw["values_prefix"] = lie(rng, decoded)
    shown = {k: (v if isinstance(v, int) else "...") for k, v in kw.items()}
    return kw, f"{what} {shown}"


def _sizes_lie(rng: random.Random, recs: list[bytes]) -> tuple[dict, str]:
    """A sizes block with a varint too many, too few, or one size changed."""
    lengths = [len(r) for r in recs]
    how = rng.choice(("more", "fewer", "value"))
    if how == "more":
        lengths += [0] * rng.randint(1, 3)
    elif how == "fewer":
        lengths = lengths[:-1]
    else:
        k = rng.randrange(len(lengths))
        lengths[k] = lie(rng, lengths[k])
    return {"sizes": b"".join(encode_varint(v) for v in lengths)}, f"sizes {how} {lengths}"


def make_case(seed: int, index: int) -> Case:
    """Case `index` of the fuzz run `seed`: one lie in an otherwise honest file."""
    rng = random.Random(f"{seed}/{index}")
    codec, group = rng.choice(CODECS), rng.choice(GROUPS)
    verify = rng.choice(("none", "headers", "all"))
    records = _records(rng)
    groups = grouped(records, group)
    chunks = [simple_chunk(g, codec) for g in groups]
    kw: dict = {"codec": codec, "options": _options(codec, group)}
    c = rng.randrange(len(chunks))
    kind = rng.choice(KINDS)
    detail = f"chunk {c}"
    if kind == "honest":
        pass
    elif kind.startswith("chunk."):
        chunks[c], d = _chunk_lie(rng, chunks[c], kind[6:])
        detail += f": {d}"
    elif kind == "stream":
        lies, d = _stream_kw(rng, len(groups[c]), chunks[c].decoded_size, codec)
        chunks[c] = simple_chunk(groups[c], codec, **lies)
        detail += f": {d}"
    elif kind == "sizes":
        lies, d = _sizes_lie(rng, groups[c])
        chunks[c] = simple_chunk(groups[c], codec, **lies)
        detail += f": {d}"
    elif kind == "count+footer":  # header and footer tell the same lie (metadata agrees)
        v = lie(rng, chunks[c].num_records, 2**56 - 1)
        chunks[c] = replace(chunks[c], num_records=v)
        kw["entries"] = lambda e, c=c, v=v: [x if k != c else (x[0], x[1], v)
                                             for k, x in enumerate(e)]
        detail += f": count {v} in header and footer"
    elif kind in ("footer.offset", "footer.decoded", "footer.count"):
        col = ("footer.offset", "footer.decoded", "footer.count").index(kind)
        v = lie(rng, chunks[c].decoded_size if col == 1 else 0)
        kw["entries"] = lambda e, c=c, col=col, v=v: [
            x if k != c else tuple(v if j == col else x[j] for j in range(3))
            for k, x in enumerate(e)]
        detail += f": entry field {col} = {v}"
        if rng.random() < 0.3:  # and the metadata keeps the true totals
            truth = (len(chunks), len(records))
            kw["meta"] = lambda n, r, t=truth: t
            detail += ", true metadata"
    elif kind == "footer.entries":
        how = rng.choice(("dup", "drop", "add", "many"))
        if how == "drop" and c == 0:  # what it skips could be a file-metadata chunk ('m'):
            how, c = ("drop", 1) if len(chunks) > 1 else ("dup", 0)  # no reader can tell
        if how == "many":  # a small file whose footer lists up to millions of entries
            n = rng.choice((1000, 100_000, 1_000_000))
            kw["entry_parts"] = (encode_footer_entry(64, 1, 1), n)
            detail = f"{n} identical entries"
        else:
            kw["entries"] = lambda e, how=how, c=c: (
                [*e[:c], e[c], *e[c:]] if how == "dup" else
                [*e[:c], *e[c + 1 :]] if how == "drop" else [*e, (e[-1][0] + 1, 1, 1)])
            detail += f": {how}"
    elif kind == "footer.meta":
        which = rng.randrange(2)
        v = lie(rng, (len(chunks), len(records))[which])
        kw["meta"] = lambda n, r, which=which, v=v: (v, r) if which == 0 else (n, v)
        detail = f"metadata field {which + 2} = {v}"
    elif kind == "footer.chunk":
        what = rng.choice(("decoded", "count", "data_size", "type"))
        ch, detail = _chunk_lie(rng, Chunk(b"", 0, 0, 0), what)
        kw["footer"] = lambda f, ch=ch, what=what: _same_lie(f, ch, what)
    elif kind == "footer.stream":
        n_entries = len(chunks) + 1
        kw["footer_kw"], detail = _stream_kw(rng, n_entries, 0, codec)
    elif kind == "post.offset":
        v = rng.choice((0, 1, 63, 64, 65, 100, 2 * BLOCK_SIZE, 2**40, 2**63, 2**64 - 1,
                        rng.randrange(2 * BLOCK_SIZE)))
        kw["footer_offset"] = lambda o, v=v: v
        detail = f"footer offset {v}"
    else:  # "post.chunk": a compressed postscript that lies about its decoded size
        kw["post_codec"] = pc = rng.choice((BROTLI, ZSTD, SNAPPY, NONE))
        v = rng.choice((2**30 + 1, 2**40, 2**63, lie(rng, 3 * 14)))
        kw["post_kw"] = {"decoded": v, "values_prefix": v} if rng.random() < 0.5 else {
            "decoded": v}
        detail = f"{Compression(pc).name} postscript claims {v} ({sorted(kw['post_kw'])})"
    data = craft(chunks, **kw)
    return Case(seed, index, kind, detail, codec, group, verify, records, data)


def _same_lie(chunk: Chunk, lied: Chunk, what: str) -> Chunk:
    """`chunk` with the field `what` taken from `lied`."""
    if what == "decoded":
        return replace(chunk, decoded_size=lied.decoded_size)
    if what == "count":
        return replace(chunk, num_records=lied.num_records)
    if what == "data_size":
        return replace(chunk, data_size=lied.data_size)
    return replace(chunk, chunk_type=lied.chunk_type)


KINDS = ("honest", "chunk.decoded", "chunk.count", "chunk.data_size", "chunk.type", "stream",
         "stream", "stream", "sizes", "count+footer", "footer.offset", "footer.decoded",
         "footer.count", "footer.entries", "footer.meta", "footer.chunk", "footer.stream",
         "post.offset", "post.chunk")
