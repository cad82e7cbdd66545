"""Footer entries: the C parser, the NumPy fallback and the slow path give one answer.

Entries are generated canonical (fields 1, 2, 3 in order) and not (reordered, missing a
field, an unknown field, a padded varint, a value of 2^63 or more), mixed in one footer; the
C loop takes the canonical prefix and hands the rest to the general parser, so every mix
must decode as the entries say — or fail the same way without the C loop.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioloader.arrayrecord.footer as footer
from aioloader.arrayrecord.errors import ArrayRecordFormatError
from aioloader.arrayrecord.proto import _varint_field, encode_footer_entry
from aioloader.arrayrecord.varint import encode_varint

pytestmark = pytest.mark.skipif(footer._native is None, reason="_footer not built")

values_ = st.integers(0, (1 << 63) - 1)


@st.composite
def entries(draw):
    out, want = [], []
    for _ in range(draw(st.integers(0, 30))):
        off, dec, rec = draw(values_), draw(values_), draw(values_)
        kind = draw(st.sampled_from(["canonical"] * 4 + ["reordered", "no_size", "extra",
                                                         "padded", "huge"]))
        if kind == "canonical":
            raw = encode_footer_entry(off, dec, rec)
        elif kind == "reordered":
            raw = _varint_field(3, rec) + _varint_field(1, off) + _varint_field(2, dec)
        elif kind == "no_size":
            raw, dec = _varint_field(1, off) + _varint_field(3, rec), 0
        elif kind == "extra":
            raw = encode_footer_entry(off, dec, rec) + _varint_field(9, 5)
        elif kind == "padded":  # a varint with a redundant continuation byte
            raw = (encode_varint(8) + bytes([0x80 | (off & 0x7F)]) + encode_varint(off >> 7)
                   + _varint_field(2, dec) + _varint_field(3, rec))
        else:
            raw = encode_footer_entry(off, dec, rec)
            raw = _varint_field(1, off) + _varint_field(2, 1 << 63) + _varint_field(3, rec)
            dec = None  # malformed: >= 2^63
        out.append(raw)
        want.append((off, dec, rec))
    return out, want


def _decode(raws, native):
    saved, footer._native = footer._native, native
    try:
        values = b"".join(raws)
        ends = np.concatenate([[0], np.cumsum([len(r) for r in raws])]).astype(np.int64)
        m = len(raws)
        cols = [np.zeros(m, np.int64) for _ in range(3)]
        first = native.entries(values, ends, *cols) if native is not None else 0
        from aioloader.arrayrecord.proto import _decode_entries_slow

        if first < m:
            got = np.zeros((m - first, 3), np.int64)
            _decode_entries_slow(values, ends[first:], got, first)
            for j in range(3):
                cols[j][first:] = got[:, j]
        return first, [tuple(int(c[k]) for c in cols) for k in range(m)]
    finally:
        footer._native = saved


@settings(max_examples=200, deadline=None)
@given(entries())
def test_the_c_loop_takes_the_canonical_prefix_and_the_rest_agrees(case):
    raws, want = case
    bad = next((k for k, w in enumerate(want) if w[1] is None), None)
    if bad is not None:
        with pytest.raises(ArrayRecordFormatError, match="malformed"):
            _decode(raws, footer._native)
        with pytest.raises(ArrayRecordFormatError, match="malformed"):
            _decode(raws, None)
        return
    first, got = _decode(raws, footer._native)
    assert got == want
    assert _decode(raws, None)[1] == want
    if all(r == encode_footer_entry(*w) for r, w in zip(raws, want)):
        assert first == len(raws)  # the common case never leaves C


def test_the_c_loop_refuses_bad_arguments():
    with pytest.raises(ValueError):
        footer._native.entries(b"", np.zeros(2, np.int64), *(np.zeros(2, np.int64),) * 3)
    with pytest.raises(TypeError):
        footer._native.entries(b"")
    assert footer._native.entries(b"\x08\x01", np.array([0, 5], np.int64),
                                  *(np.zeros(1, np.int64),) * 3) == 0  # runs past its bytes


@st.composite
def footers(draw):
    """A footer's entries with chunk offsets and record counts that are mostly valid for the
    file (increasing from byte 64 to below the footer, 1 to span records a chunk) and
    sometimes not; some entries not canonical."""
    at = draw(st.integers(0, 100)) if draw(st.booleans()) else 64
    raws, rows = [], []
    for _ in range(draw(st.integers(0, 20))):
        gap = draw(st.sampled_from([0, 1, 3, 40, 1000]) | st.integers(-5, 200))
        off, span = at, gap
        at += gap
        count = draw(st.sampled_from([1, 1, 1, span, span + 1, 0]) | st.integers(0, 300))
        dec = draw(st.integers(0, 1 << 40) | st.just((1 << 32) + 1))
        if min(off, dec, count) < 0:
            off, dec, count = max(off, 0), max(dec, 0), max(count, 0)
        raw = encode_footer_entry(off, dec, count)
        if draw(st.integers(0, 9)) == 0:
            raw = _varint_field(3, count) + _varint_field(1, off) + _varint_field(2, dec)
        raws.append(raw)
        rows.append((off, dec, count))
    footer_offset = at + draw(st.sampled_from([0, 1, 50]))
    return raws, rows, footer_offset


def _footer_chunk(raws: list[bytes]):
    from aioloader.arrayrecord.layout import CHUNK_SIMPLE, ChunkHeader
    from aioloader.arrayrecord.proto import encode_metadata

    records = [encode_metadata(len(raws), 0, "group_size:1"), *raws]
    sizes = b"".join(encode_varint(len(r)) for r in records)
    values = b"".join(records)
    data = b"\x00" + encode_varint(len(sizes)) + sizes + values
    return ChunkHeader(len(data), 0, CHUNK_SIMPLE, len(records), len(values)), data, records[0]


@settings(max_examples=300, deadline=None)
@given(footers())
def test_the_whole_footer_in_c_agrees_with_the_general_path_and_its_checks(case):
    from aioloader.arrayrecord.index import _check_entries

    raws, rows, footer_offset = case
    header, data, metadata = _footer_chunk(raws)
    general = footer.decode_footer_data(header, data, 1 << 30)
    assert general.checked is None
    assert [tuple(int(c[k]) for c in (general.offsets, general.decoded, general.records))
            for k in range(len(rows))] == rows
    try:
        want = _check_entries(general.offsets, general.records, footer_offset, None)
    except ArrayRecordFormatError:
        want = None
    fast = footer.decode_footer_data(header, data, 1 << 30, footer_offset)
    if fast.checked is None:  # the C path declined: only a footer it must not accept, one
        canonical = all(r == encode_footer_entry(*w) for r, w in zip(raws, rows))
        assert not rows or want is None or not canonical  # it leaves to the general parser,
        return  # or one without entries (never the C path's)
    assert want is not None, "C accepted entries that the checks refuse"
    total, most, widest = fast.checked
    assert (total, most) == (want[0], want[1] if rows else 0)
    assert widest == max((r[1] for r in rows), default=0)
    assert fast.metadata == metadata == general.metadata
    for a, b in [(fast.offsets, general.offsets), (fast.decoded, general.decoded),
                 (fast.records, general.records)]:
        assert np.array_equal(a, b)


def test_the_whole_footer_in_c_refuses_bad_arguments_and_odd_sizes():
    cols = [np.zeros(1, np.int64) for _ in range(3)]
    with pytest.raises(ValueError):
        footer._native.columns(b"", b"", 100, np.zeros(2, np.int64), *cols[:2])
    with pytest.raises(TypeError):
        footer._native.columns(b"")
    entry = encode_footer_entry(64, 5, 1)
    ok = bytes([2, len(entry)])
    assert footer._native.columns(ok, b"ab" + entry, 100, *cols) == (2, 1, 1, 5)
    assert footer._native.columns(ok + b"\x00", b"ab" + entry, 100, *cols) is None  # stray
    assert footer._native.columns(ok, b"ab" + entry + b"x", 100, *cols) is None  # sizes short
    assert footer._native.columns(ok, b"ab" + entry, 65, *cols) == (2, 1, 1, 5)  # 1 byte: 1
    assert footer._native.columns(ok, b"ab" + entry, 64, *cols) is None  # 0 bytes: none
    two = bytes([2, len(entry), len(entry)])
    cols2 = [np.zeros(2, np.int64) for _ in range(3)]
    assert footer._native.columns(two, b"ab" + entry * 2, 100, *cols2) is None  # not increasing


def test_the_lean_columns_decline_what_they_cannot_hold():
    lean = getattr(footer._native, "lean_columns", None)
    if lean is None:
        pytest.skip("_footer built before lean_columns")
    offsets, narrow = np.zeros(1, np.int64), np.zeros(1, np.uint32)

    def one(dec, count):
        entry = encode_footer_entry(64, dec, count)
        return bytes([2, len(entry)]), b"ab" + entry

    assert lean(*one(5, 1), 100, offsets, narrow, None) == (2, 1, 1, 5)
    assert (offsets[0], narrow[0]) == (64, 5)
    assert lean(*one((1 << 32) - 1, 1), 100, offsets, narrow, None) is not None
    assert lean(*one(1 << 32, 1), 100, offsets, narrow, None) is None  # not a uint32
    assert lean(*one(5, 2), 100, offsets, narrow, None) is None  # a count other than 1
    records = np.zeros(1, np.int64)
    assert lean(*one(5, 2), 100, offsets, narrow, records) == (2, 2, 2, 5)
    assert records[0] == 2
    with pytest.raises(ValueError):  # decoded neither m int64 nor m uint32
        lean(*one(5, 1), 100, offsets, np.zeros(1, np.uint16), None)
