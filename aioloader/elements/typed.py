"""Records that know their type: an `ElementSpec` (dtype and shape per field) and its codec.

Where the spec lives: in each ArrayRecord file's own footer metadata, as an extra field
(`ELEMENT_SPEC_FIELD`) of the `ArrayRecordMetadata` message that array_record writes and reads.
To array_record (and Grain) it is an unknown proto2 field, ignored; to us it comes free with
the footer every open already reads, so no extra request (a sidecar would cost one more GET
per dataset, could be lost or go stale when shards are copied or re-sharded, and has no
natural name for a glob). See ARRAYRECORD_FORMAT.md §8 for the message.

The spec is JSON, `{"version": 1, "fields": [{"name", "dtype", "shape"}...]}`. One unnamed
field (`name: null`) means each record is one array's raw bytes (C order): what
`convert --from npy` always wrote, so `np.frombuffer` keeps working on such files. Named
fields make a dict, the fields' bytes back to back in spec order; a field whose first
dimension is -1 (variable) is preceded by a varint count of its rows. dtype "bytes" is a
byte string (shape ()) or a list of them, each a varint length then its bytes.

Everything declared is checked before it is used: dtypes (plain numbers of a size that
means the same on every machine: `"<f4"`, `"int64"`; not `"int"`, not extended precision),
shapes (the bytes one record would need), the JSON's size, depth and field count, and each
record's length against what its spec says it holds; failures are `ElementSpecError`s saying
what and where.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..arrayrecord.proto import ELEMENT_SPEC_FIELD
from ..arrayrecord.varint import encode_varint
from ..errors import ElementSpecError

__all__ = ["ELEMENT_SPEC_FIELD", "Decode", "ElementSpec", "FieldSpec"]

VERSION = 1
MAX_SPEC_BYTES = 1 << 20
MAX_FIELDS = 4096
MAX_NDIM = 32
MAX_ELEMENT_BYTES = 1 << 40  # more than any record can hold: a shape past it is nonsense
BYTES = "bytes"
_KINDS = "biufc"  # bool, signed, unsigned, float, complex
# A dtype named with its size (what `np.dtype(x).str` writes, or numpy's sized names): the
# same on every machine, where "int", "long" or "f16" (extended precision) are not.
_SIZED = re.compile(r"[<>=|]?(?:[biufc]\d+|\?)|bool|(?:u?int|float|complex)\d+")


def _dtype(text: Any, where: str) -> np.dtype | None:
    """The numpy dtype of `text`, or None for "bytes"; only plain numbers are allowed."""
    if text == BYTES:
        return None
    if not isinstance(text, str):  # np.dtype(None) would be float64
        raise ElementSpecError(f"{where}: dtype {text!r} is not a dtype name (a string such "
                               "as '<f4' or 'int64', or 'bytes')")
    try:
        dt = np.dtype(text)
    except (TypeError, ValueError):
        raise ElementSpecError(f"{where}: dtype {text!r} is not a numpy dtype") from None
    if dt.kind not in _KINDS or dt.fields is not None or dt.subdtype is not None:
        raise ElementSpecError(f"{where}: dtype {text!r} is not a plain number type (one of "
                               "bool, int, uint, float, complex, or 'bytes')")
    if not _SIZED.fullmatch(text) or dt.itemsize > (8 if dt.kind == "f" else 16):
        raise ElementSpecError(f"{where}: dtype {text!r} ({dt}) means different things on "
                               "different machines; name a size numpy has everywhere, such "
                               "as '<f8', 'int64' or 'complex128'")
    return dt


@dataclass(frozen=True)
class FieldSpec:
    """One field: `name` (None for a single unnamed array), dtype string, shape (-1 first =
    a variable number of rows)."""

    name: str | None
    dtype: str
    shape: tuple[int, ...]

    @property
    def variable(self) -> bool:
        return bool(self.shape) and self.shape[0] == -1

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:] if self.variable else self.shape

    @cached_property
    def layout(self) -> tuple[np.dtype, int]:
        """The numpy dtype and the bytes of one row (a numeric field; checked first)."""
        dt = np.dtype(self.dtype)
        return dt, math.prod(self.row_shape) * dt.itemsize

    def check(self, where: str) -> FieldSpec:
        dt = _dtype(self.dtype, where)
        shape = self.shape
        if len(shape) > MAX_NDIM:
            raise ElementSpecError(f"{where}: {len(shape)} dimensions, at most {MAX_NDIM}")
        if any(not isinstance(d, int) or isinstance(d, bool) or d < -1 for d in shape) or \
                -1 in shape[1:]:
            raise ElementSpecError(f"{where}: shape {list(shape)} must be sizes >= 0, with -1 "
                                   "(variable) allowed only first")
        if dt is None and len(shape) > 1:
            raise ElementSpecError(f"{where}: a bytes field is a scalar or a list, not shape "
                                   f"{list(shape)}")
        need = math.prod(self.row_shape) * (dt.itemsize if dt is not None else 1)
        if need > MAX_ELEMENT_BYTES:
            raise ElementSpecError(f"{where}: shape {list(shape)} of {self.dtype} declares "
                                   f"{need} bytes a row, more than any record holds")
        if shape[:1] == (-1,) and dt is not None and need == 0:
            raise ElementSpecError(f"{where}: shape {list(shape)} has rows of 0 bytes: a record "
                                   "cannot bound how many (give the rows a size)")
        return self


@dataclass(frozen=True)
class ElementSpec:
    """What each record of a dataset holds; `decode(record)` returns it as arrays."""

    fields: tuple[FieldSpec, ...]

    # -- construction -------------------------------------------------------------------

    @classmethod
    def array(cls, dtype: Any, shape: Sequence[int]) -> ElementSpec:
        """Each record is one array of `dtype` and `shape` (-1 first: any number of rows)."""
        return cls((FieldSpec(None, _dtype_str(dtype), tuple(int(d) for d in shape)),)).check()

    @classmethod
    def of(cls, fields: Mapping[str, tuple[Any, Sequence[int]]]) -> ElementSpec:
        """Each record is a dict: `{name: (dtype or "bytes", shape)}`, in this order."""
        return cls(tuple(FieldSpec(str(n), _dtype_str(dt), tuple(int(d) for d in shape))
                         for n, (dt, shape) in fields.items())).check()

    @classmethod
    def like(cls, element: Any) -> ElementSpec:
        """The spec of one example element: an array, or a dict of arrays/bytes."""
        if isinstance(element, Mapping):
            return cls.of({n: (BYTES, ()) if isinstance(v, (bytes, bytearray)) else
                           (np.asarray(v).dtype, np.shape(v)) for n, v in element.items()})
        arr = np.asarray(element)
        return cls.array(arr.dtype, arr.shape)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "element spec") -> ElementSpec:
        """Parse and check a spec (`where` names its file in errors)."""
        if len(text) > MAX_SPEC_BYTES:
            raise ElementSpecError(f"{where}: {len(text)} bytes, more than {MAX_SPEC_BYTES}")
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ElementSpecError(f"{where}: not JSON ({exc})") from None
        except RecursionError:
            raise ElementSpecError(f"{where}: JSON nested too deeply to be an element "
                                   "spec") from None
        version = doc.get("version") if isinstance(doc, dict) else None
        if type(version) is not int or version != VERSION or \
                not isinstance(doc.get("fields"), list):  # (True == 1: not a version)
            raise ElementSpecError(f"{where}: not a version {VERSION} element spec (its "
                                   f"version is {version!r}; fields must be a list)")
        items = doc["fields"]
        if not 1 <= len(items) <= MAX_FIELDS:
            raise ElementSpecError(f"{where}: {len(items)} fields, 1 to {MAX_FIELDS} allowed")
        fields = []
        for k, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("shape"), list) or \
                    not (item.get("name") is None or isinstance(item.get("name"), str)):
                raise ElementSpecError(f"{where}: field {k} is not {{name, dtype, shape}}")
            fields.append(FieldSpec(item["name"], item.get("dtype"),  # type: ignore[arg-type]
                                    tuple(item["shape"])))  # (both checked by check())
        return cls(tuple(fields)).check(where)

    def check(self, where: str = "element spec") -> ElementSpec:
        names = [f.name for f in self.fields]
        if None in names and len(names) > 1:
            raise ElementSpecError(f"{where}: an unnamed field must be the only one")
        if len(set(names)) != len(names):
            raise ElementSpecError(f"{where}: field names repeat")
        for f in self.fields:
            f.check(f"{where}, field {f.name!r}" if f.name is not None else where)
        one = self.fields[0]
        if one.name is None and one.variable and one.dtype != BYTES and \
                math.prod(one.row_shape) == 0:
            raise ElementSpecError(f"{where}: rows of shape {list(one.row_shape)} are empty, so "
                                   "a record cannot say how many it holds")
        return self

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "fields": [
            {"name": f.name, "dtype": f.dtype, "shape": list(f.shape)} for f in self.fields]},
            separators=(",", ":"))

    @property
    def single(self) -> bool:
        return self.fields[0].name is None

    def __str__(self) -> str:
        def one(f: FieldSpec) -> str:
            shape = ",".join("None" if d == -1 else str(d) for d in f.shape)
            return f"{f.dtype}[{shape}]" if f.name is None else f"{f.name}: {f.dtype}[{shape}]"
        return "{" + ", ".join(map(one, self.fields)) + "}" if not self.single else \
            one(self.fields[0])

    # -- the codec ----------------------------------------------------------------------

    def encode(self, element: Any) -> bytes:
        """The record bytes of `element` (an array, or a dict of them); checks it fits."""
        if self.single:
            return _encode_field(self.fields[0], element, raw=True)
        if not isinstance(element, Mapping):
            raise ElementSpecError(f"expected a dict with fields {[f.name for f in self.fields]}"
                                   f", got {type(element).__name__}")
        missing = [f.name for f in self.fields if f.name not in element]
        if missing:
            raise ElementSpecError(f"element lacks fields {missing}")
        return b"".join(_encode_field(f, element[f.name]) for f in self.fields)

    def decode(self, record: bytes | memoryview) -> Any:
        """The arrays of one record (fresh, writable copies); ElementSpecError if its length
        does not fit the spec."""
        one = self.fields[0]
        if self.single and not one.variable and one.dtype != BYTES and \
                len(record) == one.layout[1]:  # the common case, one array: straight to it
            return np.frombuffer(record, one.layout[0]).reshape(one.shape).copy()
        view = memoryview(record).cast("B")
        if self.single:
            value, _ = _decode_field(one, view, 0, raw=True)
            return value
        out, pos = {}, 0
        for f in self.fields:
            out[f.name], pos = _decode_field(f, view, pos)
        if pos != len(view):
            raise ElementSpecError(f"record is {len(view)} bytes, its fields {self} take {pos}")
        return out


class Decode:
    """The record op `decode="auto"` adds: record bytes → arrays by the files' spec."""

    def __init__(self, spec: ElementSpec) -> None:
        self.spec = spec
        self.__qualname__ = "decode"  # how describe() names the op (the class keeps its own)

    def __call__(self, record: bytes) -> Any:
        return self.spec.decode(record)

    def __repr__(self) -> str:
        return f"decode({self.spec})"


def _dtype_str(dtype: Any) -> str:
    return BYTES if dtype in (BYTES, bytes) else np.dtype(dtype).str


def _read_varint(view: memoryview, pos: int, what: str) -> tuple[int, int]:
    value = shift = 0
    for k in range(pos, min(pos + 10, len(view))):
        b = view[k]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, k + 1
        shift += 7
    raise ElementSpecError(f"record ends or breaks inside the {what} at byte {pos}")


def _encode_field(f: FieldSpec, value: Any, raw: bool = False) -> bytes:
    label = "the element" if f.name is None else f"field {f.name!r}"
    if f.dtype == BYTES:
        items = [value] if f.shape == () else list(value)
        if f.shape not in ((), (-1,)) and len(items) != f.shape[0]:
            raise ElementSpecError(f"{label}: {len(items)} strings, spec says {f.shape[0]}")
        head = encode_varint(len(items)) if f.variable else b""
        return head + b"".join(encode_varint(len(b)) + bytes(b) for b in items)
    arr = np.asarray(value)
    if arr.dtype.kind not in _KINDS or not np.can_cast(arr.dtype, f.dtype, "same_kind"):
        raise ElementSpecError(f"{label}: dtype {arr.dtype} does not fit {f.dtype}")
    rows = arr.shape[: 1] if f.variable else ()
    if tuple(arr.shape) != (*rows, *f.row_shape):
        raise ElementSpecError(f"{label}: shape {arr.shape} does not fit {list(f.shape)}")
    data = np.ascontiguousarray(arr, dtype=f.dtype).tobytes()
    return data if raw or not f.variable else encode_varint(arr.shape[0]) + data


def _decode_field(f: FieldSpec, view: memoryview, pos: int,
                  raw: bool = False) -> tuple[Any, int]:
    label = "record" if f.name is None else f"field {f.name!r}"
    left = len(view) - pos
    if f.dtype == BYTES:
        if f.variable:
            count, pos = _read_varint(view, pos, f"{label}'s count")
            if count > len(view) - pos:  # each string takes at least its length byte
                raise ElementSpecError(f"{label}: {count} strings cannot fit "
                                       f"{len(view) - pos} bytes")
        else:
            count = 1 if f.shape == () else f.shape[0]
        items = []
        for _ in range(count):
            n, pos = _read_varint(view, pos, f"{label}'s string length")
            if n > len(view) - pos:
                raise ElementSpecError(f"{label}: a {n}-byte string runs past the record's end")
            items.append(bytes(view[pos : pos + n]))
            pos += n
        if f.shape == ():
            return items[0], pos
        out = np.empty(count, dtype=object)  # a list of strings, never a 2-d 'S' array
        out[:] = items
        return out, pos
    dt, row = f.layout
    if raw and f.variable:  # the whole record is rows
        if row == 0 or left % row:
            raise ElementSpecError(f"{label} is {left} bytes, not whole rows of "
                                   f"{dt}{list(f.row_shape)} ({row} bytes each)")
        rows = left // row
    elif f.variable:
        rows, pos = _read_varint(view, pos, f"{label}'s row count")
        left = len(view) - pos
        if rows > len(view):  # even empty rows are not counted past the record's size
            raise ElementSpecError(f"{label}: {rows} rows in a {len(view)}-byte record")
    else:
        rows = None
    need = row * (1 if rows is None else rows)
    if need > left or (raw and need != left):
        raise ElementSpecError(f"{label} is {left} bytes, spec {dt}{list(f.shape)} needs {need}")
    shape = f.shape if rows is None else (rows, *f.row_shape)
    arr = np.frombuffer(view, dt, need // dt.itemsize, pos).reshape(shape).copy()
    return arr, pos + need


def files_spec(files: Sequence[tuple[str | None, str]]) -> ElementSpec | None:
    """The one spec that every file (`(path, spec JSON or "")`) records, or None when none
    does; ElementSpecError naming the file when one is malformed, lacks it, or differs."""
    specs = [(path, ElementSpec.from_json(text, f"{path}: element spec") if text else None)
             for path, text in files]
    first = next((s for _, s in specs if s is not None), None)
    if first is None:
        return None
    for path, spec in specs:
        if spec != first:
            raise ElementSpecError(
                f"{path}: {'records no element spec' if spec is None else f'records {spec}'}, "
                f"other files {first}: files of one dataset must hold the same elements")
    return first
