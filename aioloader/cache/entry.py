"""The disk tier's entry format, and the checks that prove an entry (aioloader.cache.disk
stores them; a worker checks one it meets under an identity its parent did not prove).

An entry is a 64-byte header (magic, a BLAKE2b digest of the segment's key, start, length),
the payload, and a 16-byte trailer (HighwayHash-64 of header and payload, an end magic).
"""

from __future__ import annotations

import os
import stat
import struct

from ..arrayrecord.hashing import highwayhash64

MAGIC = b"AIOLSEG1"
END = b"AIOLEND1"
HEADER = struct.Struct("<8s32sQQ8x")  # magic, key digest, start, length, reserved
TRAILER = struct.Struct("<Q8s")  # highwayhash64(header + payload), end magic
PAYLOAD_AT = HEADER.size  # a segment's byte s lies at PAYLOAD_AT + s - start of its entry


class EntryError(ValueError):
    """Why an entry was not used (internal: a warning, the entry dropped, a re-fetch)."""


def entry_size(n: int) -> int:
    """Bytes on disk of the entry of an `n`-byte segment."""
    return PAYLOAD_AT + n + TRAILER.size


def check_named(fd: int, st: os.stat_result, name: str, start: int) -> None:
    """The checks of an entry where its key is known only by its name and the segment's start (a
    worker's: the name is the key digest's first 160 bits)."""
    digest, at, _, _ = proved(fd, st)
    if digest.hex()[:40] + ".seg" != name or at != start:
        raise EntryError("it belongs to another segment, file or version")


def proved(fd: int, st: os.stat_result) -> tuple[bytes, int, int, bytes]:
    """(key digest, start, length, the entry) of a whole, undamaged entry of ours; else
    EntryError."""
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise EntryError("it is not a plain file of ours")
    if st.st_size < entry_size(0):
        raise EntryError(f"it is {st.st_size} bytes: truncated")
    data = os.pread(fd, st.st_size, 0)
    if len(data) != st.st_size:
        raise EntryError("it shrank while being read")
    magic, digest, start, n = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EntryError("it is not a segment entry (bad magic)")
    if st.st_size != entry_size(n):
        raise EntryError(f"it is {st.st_size} bytes, not {entry_size(n)} (truncated?)")
    stored, end = TRAILER.unpack_from(data, PAYLOAD_AT + n)
    if end != END:
        raise EntryError("its trailer is missing (half written?)")
    if highwayhash64(memoryview(data)[: PAYLOAD_AT + n]) != stored:
        raise EntryError("its checksum does not match its content (damaged or edited)")
    return digest, start, n, data
