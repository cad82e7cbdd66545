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
