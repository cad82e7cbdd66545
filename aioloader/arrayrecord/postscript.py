"""The postscript: the last 64 KiB block's chunk, whose record says where the footer starts.

`parse_postscript` checks it and returns the footer offset; `quick_postscript` reads the
usual postscript (one uncompressed chunk of one-byte records) without a chunk decode, with
every check the general path makes, and gives way (None) on anything else. Apart from
`index` (the opening's read requests and the footer) because thousands of small files'
opens are mostly this parse.
"""

from __future__ import annotations

from . import quickopen
from .chunk import RECORD_COST
from .decoding import _check_fills, decode_chunk
from .errors import ArrayRecordFormatError
from .hashing import highwayhash64
from .layout import (
    _BLOCK,
    _HEADER,
    BLOCK_HEADER_SIZE,
    CHUNK_HEADER_SIZE,
    CHUNK_SIMPLE,
    ChunkHeader,
    check_block_header,
)
from .proto import POSTSCRIPT_MAGIC, parse_fields
from .varint import encode_varint

POSTSCRIPT_MAX_DECODED = 1 << 16  # three ~20-byte records: a crafted claim costs nothing


def index_verify(verify: str) -> str:
    # The index is read once per file and everything else trusts it: hash all of it.
    return "none" if verify == "none" else "all"


_MAGIC_FIELD = b"\x10" + encode_varint(POSTSCRIPT_MAGIC)  # field 2, the magic number
_CHUNK_AT = BLOCK_HEADER_SIZE + CHUNK_HEADER_SIZE  # the postscript's data, in its block


def quick_postscript(raw, pos: int, verify: str, block_end: int | None = None) -> int | None:
    """The footer offset from the usual postscript (an uncompressed simple chunk of one to
    three records, each record one byte of size, the first intact and canonical), with every
    check `parse_postscript` makes; None for anything else, which that then parses or names.

    Opening thousands of small files is mostly this parse, and the general path decodes a
    chunk and parses three messages into dicts. `raw` is the last block, or (with
    `block_end`, where that block ends) its first bytes.
    """
    native = quickopen.postscript_offset(raw, pos, verify,
                                         pos + len(raw) if block_end is None else block_end)
    if native is not None:  # (None: not native, or not the usual file: parsed below)
        return native
    try:
        n_raw = len(raw)
        if n_raw < _CHUNK_AT + 2:
            return None
        _, prev, _ = _BLOCK.unpack_from(raw)
        _, data_size, data_hash, type_count, decoded = _HEADER.unpack_from(raw, BLOCK_HEADER_SIZE)
        n = type_count >> 8
        end = _CHUNK_AT + data_size
        if prev or type_count & 0xFF != CHUNK_SIMPLE or not 1 <= n <= 3 or end > n_raw or \
                decoded + RECORD_COST * n > POSTSCRIPT_MAX_DECODED:
            return None
        data = bytes(raw[_CHUNK_AT:end])
        if data[0] != 0 or data[1] != n or 2 + n + decoded != data_size:
            return None  # compressed, or sizes not one byte each
        sizes = data[2 : 2 + n]
        if max(sizes) >= 0x80 or sum(sizes) != decoded:
            return None
        if verify != "none" and (
                highwayhash64(raw[8:BLOCK_HEADER_SIZE]) != _BLOCK.unpack_from(raw)[0] or
                highwayhash64(raw[BLOCK_HEADER_SIZE + 8 : _CHUNK_AT]) !=
                _HEADER.unpack_from(raw, BLOCK_HEADER_SIZE)[0] or
                highwayhash64(data) != data_hash):
            return None
        record = data[2 + n : 2 + n + sizes[0]]
        if record[0] != 0x08:
            return None
        offset, shift, k = 0, 0, 1
        while k < 10 and record[k] & 0x80:
            offset |= (record[k] & 0x7F) << shift
            shift, k = shift + 7, k + 1
        offset |= record[k] << shift
        if record[k + 1 :] != _MAGIC_FIELD or not 64 <= offset < pos:
            return None
        _check_fills(pos, raw, ChunkHeader(data_size, data_hash, CHUNK_SIMPLE, n, decoded),
                     block_end)
        return offset
    except Exception:  # anything odd: the general path parses it or says why
        return None


def parse_postscript(raw, pos: int, verify: str, path: str | None) -> int:
    """Footer offset from the postscript chunk at `pos` (the file's last block)."""
    quick = quick_postscript(raw, pos, verify)
    if quick is not None:
        return quick
    try:
        if len(raw) < BLOCK_HEADER_SIZE + CHUNK_HEADER_SIZE:
            raise ArrayRecordFormatError("postscript truncated")
        if verify != "none":
            prev, _ = check_block_header(raw[:BLOCK_HEADER_SIZE], pos, path)
            if prev != 0:
                raise ArrayRecordFormatError("no chunk starts at the last 64 KiB block")
        # Three ~20-byte records: a 64 KiB bound keeps a crafted claim from costing anything.
        _, records = decode_chunk(raw, pos, verify=index_verify(verify), path=path,
                                  max_decoded=POSTSCRIPT_MAX_DECODED, whole_range=True)
        for j in range(min(3, len(records))):  # copies 2 and 3 back up a damaged copy 1
            try:
                fields = parse_fields(records.view(j))
            except ArrayRecordFormatError:
                continue
            if fields.get(2) == POSTSCRIPT_MAGIC and isinstance(fields.get(1), int):
                footer_offset = int(fields[1])
                if not 64 <= footer_offset < pos:
                    raise ArrayRecordFormatError(
                        f"postscript points at footer offset {footer_offset}, outside the file"
                    )
                return footer_offset
        raise ArrayRecordFormatError("no record with the ArrayRecord magic number")
    except ArrayRecordFormatError as err:
        raise ArrayRecordFormatError(
            f"no valid ArrayRecord postscript in the last 64 KiB block: {err.what}",
            path=path, offset=pos,
            hint="this is not an ArrayRecord file, or it is truncated or corrupted",
        ) from None
