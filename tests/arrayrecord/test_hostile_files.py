"""Crafted files whose hashes are valid but whose declared sizes, counts or offsets lie.

Each must give `ArrayRecordFormatError` naming the file (and the chunk, for a data chunk) or
exactly the right records, through every entry point: the format layer, `ArrayRecordSource`,
`aioloader inspect` and the loader (its main process and its workers). Anything that once
killed the process runs in a subprocess, so a regression fails the test instead of pytest.
The generator is tests/support/hostile.py, the runner tests/support/hostile_run.py; the fuzz
runs here, a sample in the fast tier and 20,000 cases under `make test-slow`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest

from aioloader.arrayrecord import ArrayRecordFormatError, RangeReader, read_index
from aioloader.arrayrecord.codecs import BROTLI, NONE, SNAPPY, ZSTD
from aioloader.arrayrecord.index import decode_records
from aioloader.arrayrecord.layout import BLOCK_SIZE
from aioloader.arrayrecord.proto import encode_footer_entry

from ..support.hostile import craft, grouped, honest, simple_chunk
from ..support.hostile_run import NAME, decoder_reads, run_cases

CODECS = {"uncompressed": NONE, "zstd": ZSTD, "brotli": BROTLI, "snappy": SNAPPY}
RECORDS = [b"record %d " % i * (i + 1) for i in range(6)]
TIB = 1 << 40
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_all(data: bytes, **kw) -> list[bytes]:
    reader = RangeReader(lambda o, n: data[o : o + n], len(data), path=NAME, **kw)
    return list(reader)


def worker_decode(data: bytes, **kw) -> list[bytes]:
    """The records as the workers' batch decoder returns them."""
    reader = RangeReader(lambda o, n: data[o : o + n], len(data), path=NAME)
    ix = reader.index
    chunks, within = ix.locate(range(len(reader)))
    ranges = [ix.chunk_range(int(c)) for c in chunks]
    verify = kw.pop("verify", "headers")
    try:
        got = decode_records([data[s:e] for s, e in ranges], [s for s, _ in ranges],
                             within.tolist(), paths=[NAME] * len(ranges),
                             chunks=chunks.tolist(), counts=ix.chunk_records[chunks].tolist(),
                             verify=verify, **kw)
    except ArrayRecordFormatError:
        # A worker reading the file itself refuses it too.
        with pytest.raises(ArrayRecordFormatError, match=NAME):
            decoder_reads(data, ix, chunks, within, verify, kw)
        raise
    assert decoder_reads(data, ix, chunks, within, verify, kw) == got
    return got


def with_chunk(codec: int, group: int, c: int, **lies) -> bytes:
    """RECORDS in chunks of `group`, chunk `c` built with `lies` (see hostile.chunk_from)."""
    chunks = [simple_chunk(g, codec, **(lies if k == c else {}))
              for k, g in enumerate(grouped(RECORDS, group))]
    return craft(chunks, codec=codec)


def test_honest_crafted_files_read_back():
    for codec in CODECS.values():
        for group in (1, 4):
            assert read_all(honest(RECORDS, codec, group), verify="all") == RECORDS


# -- 1. a codec stream must decode to exactly the declared size -----------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("how", ["short", "long"])
def test_stream_that_decodes_short_or_long_is_an_error(codec, group, how):
    """The header and the block prefix both declare 1,000 bytes more (or less) than the
    stream decodes to; brotli used to return the record zero-padded (or the long one)."""
    true = len(b"".join(grouped(RECORDS, group)[1]))
    claim = true + 1000 if how == "short" else true
    edit = (lambda v: v) if how == "short" else (lambda v: v + b"x" * 1000)
    data = with_chunk(CODECS[codec], group, 1, decoded=claim, values_prefix=claim, edit=edit)
    for read in (read_all, worker_decode):
        with pytest.raises(ArrayRecordFormatError) as info:
            read(data, verify="all")
        assert NAME in str(info.value) and "chunk 1" in str(info.value)


# -- 2. the footer's record count must agree with the chunk's header -----------------------


@pytest.mark.parametrize("footer,header", [(0, 1), (2, 1), (2, 3), (4, 3)])
def test_footer_count_disagreeing_with_the_header_is_an_error(footer, header):
    """Footer 0 vs header 1 silently dropped the record; 2 vs 1 was accepted."""
    group = header
    chunks = [simple_chunk(g, ZSTD) for g in grouped(RECORDS, group)]
    data = craft(chunks, entries=lambda e: [x if k != 1 else (x[0], x[1], footer)
                                            for k, x in enumerate(e)])
    for read in (read_all, worker_decode):
        with pytest.raises(ArrayRecordFormatError) as info:
            read(data, verify="headers")
        assert NAME in str(info.value) and "chunk 1" in str(info.value)


@pytest.mark.parametrize("how", ["getitem", "loader0", "loader1"])
@pytest.mark.parametrize("footer,header", [(0, 1), (1, 2), (2, 1)])
def test_footer_count_lie_through_the_source_and_the_loader(tmp_path, how, footer, header):
    """Footer 0 vs header 1 silently dropped the record everywhere; footer 1 vs header 2
    (every other chunk holding 1) dropped one in the workers, which decode such files."""
    chunks = [simple_chunk(g, ZSTD) for g in grouped(RECORDS, 1)]
    chunks[1] = simple_chunk(RECORDS[1:1 + header], ZSTD)
    path = tmp_path / "count-lie.ar"
    path.write_bytes(craft(chunks, entries=lambda e: [x if k != 1 else (x[0], x[1], footer)
                                                      for k, x in enumerate(e)]))
    out = probe(path, how)
    assert "ArrayRecordFormatError:" in out and "count-lie.ar" in out, out
    assert "chunk 1" in out, out


def test_footer_count_larger_than_its_chunk_can_hold_is_an_error():
    """A chunk of n records occupies at least n bytes, so a footer cannot claim 2**40
    records in a 128 KiB file: `len` used to say so, and a shuffle would then allocate."""
    chunks = [simple_chunk(g, ZSTD) for g in grouped(RECORDS, 1)]
    data = craft(chunks, entries=lambda e: [x if k != 2 else (x[0], x[1], TIB)
                                            for k, x in enumerate(e)])
    with pytest.raises(ArrayRecordFormatError, match=r"chunk 2") as info:
        RangeReader(lambda o, n: data[o : o + n], len(data), path=NAME)
    assert NAME in str(info.value)


@pytest.mark.parametrize("codec", CODECS)
def test_one_record_chunk_whose_sizes_block_holds_two_is_an_error(codec):
    """Header, footer and metadata all say 1 record; the sizes block says [127, 1]. Taking
    the values block as one record would join two records into one."""
    recs = [b"a" * 127, b"b"]
    chunks = [simple_chunk([b"x"], CODECS[codec]), simple_chunk(recs, CODECS[codec], count=1)]
    data = craft(chunks, codec=CODECS[codec])
    for read in (read_all, worker_decode):
        with pytest.raises(ArrayRecordFormatError, match="sizes block") as info:
            read(data, verify="headers")
        assert "chunk 1" in str(info.value)


def test_a_chunk_left_out_of_the_footer_is_noticed():
    """Dropping chunk 2's entry (metadata made to agree) gives chunk 1 a range holding two
    chunks: reading chunk 1 says so, instead of skipping chunk 2's records."""
    chunks = [simple_chunk(g, ZSTD) for g in grouped(RECORDS, 1)]
    data = craft(chunks, entries=lambda e: [x for k, x in enumerate(e) if k != 2])
    for read in (read_all, worker_decode):
        with pytest.raises(ArrayRecordFormatError, match="missing from the footer") as info:
            read(data, verify="headers")
        assert "chunk 1" in str(info.value)


@pytest.mark.parametrize("codec", [NONE, ZSTD])
def test_a_chunk_left_out_of_the_footer_where_padding_could_be_is_noticed(codec):
    """The chunk before a block boundary dropped from the footer: its bytes sit where a
    padding chunk could, so the gap must be checked to be one (found in review)."""
    first, last = simple_chunk([b"A" * 10], codec), simple_chunk([b"C" * 10], codec)
    noise = random.Random(0).randbytes(65536)  # incompressible: sizes are what they say
    for size in range(65000, 65536):  # the middle chunk ends exactly at a block boundary
        middle = simple_chunk([noise[:size]], codec)
        whole = craft([first, middle, last], codec=codec)
        if read_index(len(whole), lambda o, n, f=whole: f[o : o + n]).chunk_offsets[2] \
                % BLOCK_SIZE == 0:
            break
    else:
        raise AssertionError("no size puts the last chunk on a block boundary")
    data = craft([first, middle, last], codec=codec, entries=lambda e: [e[0], e[2]])
    for read in (read_all, worker_decode):
        with pytest.raises(ArrayRecordFormatError, match="not a padding chunk") as info:
            read(data, verify="headers")
        assert "chunk 0" in str(info.value)


# -- 5. a declared size is bounded before anything is allocated ----------------------------


PROBE = textwrap.dedent("""
    import asyncio, sys
    import aioloader as al
    path, how = sys.argv[1], sys.argv[2]
    async def drain(workers):
        ds = al.Dataset.from_arrayrecord(path).map(len).batch(2)
        async with ds.loader(workers=workers) as it:
            async for _ in it:
                pass
    try:
        if how == "len":
            print(len(al.ArrayRecordSource(path)))
        elif how == "getitem":
            src = al.ArrayRecordSource(path)
            print([len(src[i]) for i in range(len(src))])
        elif how.startswith("loader"):
            asyncio.run(drain(int(how[-1])))
        print("OK")
    except al.ArrayRecordFormatError as err:
        print("ArrayRecordFormatError:", err)
    except BaseException as err:
        print("OTHER", type(err).__name__, err)
""")


def probe(path, how: str) -> str:
    """Run one entry point on `path` in a child; return what it printed (it must exit 0)."""
    if how == "inspect":
        args = ["-m", "aioloader.tools.cli", "inspect", str(path)]
    else:
        args = ["-c", PROBE, str(path), how]
    proc = subprocess.run([sys.executable, *args], capture_output=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    out = proc.stdout.decode() + proc.stderr.decode()
    if how == "inspect":
        assert proc.returncode == 1, f"exit {proc.returncode}: {out}"
        return "ArrayRecordFormatError: " + proc.stderr.decode()
    assert proc.returncode == 0, f"exit {proc.returncode}: {out}"
    return out


def _tib_in_postscript() -> bytes:
    return honest(RECORDS, ZSTD, 1, post_codec=BROTLI,
                  post_kw={"decoded": TIB, "values_prefix": TIB})


def _tib_in_chunk(group: int = 1) -> bytes:
    return with_chunk(BROTLI, group, 1, decoded=TIB, values_prefix=TIB)


@pytest.mark.parametrize("how", ["inspect", "len", "loader0"])
def test_postscript_claiming_a_tebibyte_is_an_error_not_an_abort(tmp_path, how):
    path = tmp_path / "tib-postscript.ar"
    path.write_bytes(_tib_in_postscript())
    out = probe(path, how)
    assert "ArrayRecordFormatError:" in out and "tib-postscript.ar" in out, out


@pytest.mark.parametrize("how", ["getitem", "loader0", "loader1"])
def test_chunk_claiming_a_tebibyte_is_an_error_not_an_abort(tmp_path, how):
    """In a worker this used to be "worker died (signal 6)", naming neither file nor chunk."""
    path = tmp_path / "tib-chunk.ar"
    path.write_bytes(_tib_in_chunk())
    out = probe(path, how)
    assert "ArrayRecordFormatError:" in out and "tib-chunk.ar" in out, out
    assert "chunk 1" in out, out


def test_declared_sizes_are_checked_against_the_budget():
    """A chunk that really decodes to more than `max_decoded` is refused, saying so."""
    recs = [bytes(3 << 20)]
    data = honest(recs, ZSTD, 1)
    assert read_all(data) == recs
    with pytest.raises(ArrayRecordFormatError, match="budget") as info:
        read_all(data, max_decoded=1 << 20)
    assert "chunk 0" in str(info.value)


# -- 6. nothing is allocated for what the file does not hold --------------------------------


RSS = textwrap.dedent("""
    import resource, sys
    from aioloader.arrayrecord import ArrayRecordFormatError, RangeReader
    data = open(sys.argv[1], "rb").read()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        reader = RangeReader(lambda o, n: data[o : o + n], len(data), path=sys.argv[1],
                             **eval(sys.argv[2]))
        print("records", [len(r) for r in reader])
    except ArrayRecordFormatError as err:
        print("ArrayRecordFormatError:", err)
    print("grew", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10, "MiB")
""")


def grown(path, kw: str = "{}") -> tuple[str, int]:
    proc = subprocess.run([sys.executable, "-c", RSS, str(path), kw], capture_output=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    out = proc.stdout.decode()
    assert proc.returncode == 0, out + proc.stderr.decode()
    return out, int(out.split("grew ")[1].split()[0])


def test_millions_of_footer_entries_in_a_small_file_fail_in_bounded_memory(tmp_path):
    """8M identical entries (a few KiB compressed) used to reach 1.2 GB before failing."""
    path = tmp_path / "8m-entries.ar"
    path.write_bytes(craft([simple_chunk([b"x"], ZSTD)],
                           entry_parts=(encode_footer_entry(64, 1, 1), 8_000_000)))
    assert os.path.getsize(path) < 2 << 20
    out, grew = grown(path)
    assert "ArrayRecordFormatError:" in out and "8m-entries.ar" in out, out
    assert grew < 64, out


def test_a_gibibyte_claim_allocates_nothing(tmp_path):
    """A brotli block claiming 1 GiB that decodes to 8 bytes used to come back as a 1 GiB
    zero-padded record; even with a budget that allows it, it is an error, and cheap."""
    path = tmp_path / "gib-claim.ar"
    path.write_bytes(with_chunk(BROTLI, 1, 1, decoded=1 << 30, values_prefix=1 << 30))
    out, grew = grown(path, "{'max_decoded': 2 << 30, 'verify': 'all'}")
    assert "ArrayRecordFormatError:" in out and "chunk 1" in out, out
    assert grew < 64, out


# -- the fuzz --------------------------------------------------------------------------------


def test_hostile_fuzz_sample():
    """A few hundred crafted lies, in a child under a 4 GiB address-space limit."""
    failures = run_cases(seed=13, start=0, stop=300)
    assert not failures, "\n\n".join(failures[:10])


@pytest.mark.slow
def test_hostile_fuzz_long():
    """20,000 crafted lies: only ArrayRecordFormatError or the right records; never a
    signal, a case over 10 s, or a child over 1 GiB of RSS."""
    failures = run_cases(seed=2024, start=0, stop=20_000)
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures[:20])
