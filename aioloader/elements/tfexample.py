"""`tf.train.Example` records decoded into named fields, without TensorFlow.

An Example is a small protobuf (`Example{features: Features{feature: map<string, Feature>}}`,
`Feature` one of `bytes_list`, `float_list`, `int64_list`, each `repeated ... value = 1`,
numbers packed or not); the wire format is read with the format layer's own parser
(`arrayrecord.proto.iter_fields`). `convert --decode-examples` turns each Example into one
typed record (`aioloader.elements.typed`) by a feature description, given (like TensorFlow's
`FixedLenFeature` / `VarLenFeature`: `"image:bytes,label:int64,emb:float32[128],
tokens:int64[-1]"`) or taken from the first Example (a feature of one value is a scalar, of n
values shape [n]); an Example that does not fit it is an error naming the file and record.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..arrayrecord.errors import ArrayRecordFormatError
from ..arrayrecord.proto import iter_fields
from ..arrayrecord.varint import decode_varints, encode_varint
from ..errors import ConvertError, ElementSpecError
from .typed import BYTES, ElementSpec, FieldSpec

BYTES_LIST, FLOAT_LIST, INT64_LIST = 1, 2, 3
_KIND_NAMES = {BYTES_LIST: "bytes", FLOAT_LIST: "float", INT64_LIST: "int64"}
_WIRES = {BYTES_LIST: (2,), FLOAT_LIST: (2, 5), INT64_LIST: (2, 0)}  # packed or not
_DEFAULT_DTYPES = {BYTES_LIST: BYTES, FLOAT_LIST: "<f4", INT64_LIST: "<i8"}


def _numbers(kind: int, wire: int, value: Any) -> list | np.ndarray:
    if kind == FLOAT_LIST:
        if wire == 2:  # packed
            if len(value) % 4:
                raise ArrayRecordFormatError("packed float list is not whole floats")
            return np.frombuffer(value, dtype="<f4")
        return [struct.unpack("<f", value.to_bytes(4, "little"))[0]]
    if wire == 2:
        arr = np.frombuffer(value, dtype=np.uint8)
        return decode_varints(arr, int(np.count_nonzero(arr < 0x80))).view(np.int64)
    return [value - (1 << 64) if value >= 1 << 63 else value]


def parse_example(buf: bytes | memoryview) -> dict[str, tuple[int, np.ndarray | list]]:
    """`{feature name: (kind, values)}` of one serialized Example; kind is BYTES_LIST,
    FLOAT_LIST or INT64_LIST; ArrayRecordFormatError if it is not an Example."""
    out: dict[str, tuple[int, Any]] = {}
    for number, wire, features in iter_fields(buf):
        if number != 1 or wire != 2:
            continue
        for n, w, entry in iter_fields(features):
            if n != 1 or w != 2:
                continue
            name, feature = "", b""
            for m, v, val in iter_fields(entry):
                if m == 1 and v == 2:
                    name = val.decode("utf-8", "replace")
                elif m == 2 and v == 2:
                    feature = val
            values: Any = []  # an empty Feature reads as an empty list
            kind = BYTES_LIST
            for k, v, lst in iter_fields(feature):
                if k not in _KIND_NAMES or v != 2:
                    continue
                kind, parts = k, []
                for m, wv, val in iter_fields(lst):
                    if m != 1:
                        continue
                    if wv not in _WIRES[k]:
                        raise ArrayRecordFormatError(f"{_KIND_NAMES[k]} list value of wire "
                                                     f"type {wv}")
                    parts.append([val] if k == BYTES_LIST else _numbers(k, wv, val))
                values = [x for p in parts for x in p] if k == BYTES_LIST else (
                    np.concatenate([np.asarray(p) for p in parts]) if parts else [])
            out[name] = (kind, values)
    return out


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serialize `{name: values}` as a tf.train.Example (bytes → bytes_list, floats →
    float_list, ints → int64_list); for tests and fixtures, as `write_tfrecord` is."""
    def field(n: int, payload: bytes) -> bytes:
        return encode_varint(n << 3 | 2) + encode_varint(len(payload)) + payload

    entries = b""
    for name, values in features.items():
        if isinstance(values, (bytes, str)) or np.ndim(values) == 0:
            values = [values]
        values = list(values)
        if values and isinstance(values[0], (bytes, str)):
            body = b"".join(field(1, v.encode() if isinstance(v, str) else v) for v in values)
            kind = BYTES_LIST
        elif values and np.asarray(values).dtype.kind == "f":
            body = field(1, np.asarray(values, dtype="<f4").tobytes())
            kind = FLOAT_LIST
        else:
            body = field(1, b"".join(encode_varint(int(v) & ((1 << 64) - 1)) for v in values))
            kind = INT64_LIST
        entries += field(1, field(1, name.encode()) + field(2, field(kind, body)))
    return field(1, entries)


_FEATURE = re.compile(r"^\s*([^:\s,]+)\s*:\s*([A-Za-z0-9<>=|]+)\s*(?:\[([-\d,\s]*)\])?\s*$")


def parse_features(text: str) -> ElementSpec:
    """`"image:bytes,label:int64,emb:float32[128],tokens:int64[-1]"` → an ElementSpec."""
    fields = {}
    for item in re.split(r",(?![^\[]*\])", text):
        m = _FEATURE.match(item)
        if not m:
            raise ConvertError(f"feature description {item.strip()!r} is not NAME:DTYPE[SHAPE]")
        shape = tuple(int(d) for d in m.group(3).split(",") if d.strip()) if m.group(3) else ()
        fields[m.group(1)] = (m.group(2), shape)
    try:
        return ElementSpec.of(fields)
    except (ElementSpecError, TypeError) as exc:
        raise ConvertError(f"feature description {text!r}: {exc}") from None


class ExampleDecoder:
    """Example bytes → typed records by `spec`; without one, the first Example sets it."""

    def __init__(self, spec: ElementSpec | None = None) -> None:
        self.spec = spec
        self.inferred = spec is None

    def __call__(self, record: bytes, path: str, index: int) -> bytes:
        where = f"{path}: record {index}"
        try:
            feats = parse_example(record)
        except ArrayRecordFormatError as exc:
            raise ConvertError(f"{where} is not a tf.train.Example ({exc.what})") from None
        if self.spec is None:
            self.spec = ElementSpec(tuple(
                FieldSpec(name, _DEFAULT_DTYPES[kind], () if len(v) == 1 else (len(v),))
                for name, (kind, v) in sorted(feats.items()))).check(where)
        if self.inferred and set(feats) != {f.name for f in self.spec.fields}:
            raise ConvertError(f"{where} has features {sorted(feats)}, the first Example "
                               f"{sorted(str(f.name) for f in self.spec.fields)}; describe them "
                               "with --features (e.g. 'tokens:int64[-1]' for a variable one)")
        hint = " (as the first Example had it; describe the features with --features)" \
            if self.inferred else ""
        out = {}
        try:
            for f in self.spec.fields:
                got = feats.get(f.name or "")
                kind, values = got if got is not None else (None, [])
                if kind is None and not f.variable:
                    raise ConvertError(f"{where} lacks feature {f.name!r}")
                out[f.name] = self._value(f, kind, values, where)  # type: ignore[arg-type]
            return self.spec.encode(out)
        except ElementSpecError as exc:
            raise ConvertError(f"{where}: {exc}{hint}") from None
        except ConvertError as exc:
            raise ConvertError(f"{exc}{hint}") from None

    @staticmethod
    def _value(f: FieldSpec, kind: int | None, values: Sequence, where: str) -> Any:
        want = BYTES_LIST if f.dtype == BYTES else (
            FLOAT_LIST if np.dtype(f.dtype).kind in "fc" else INT64_LIST)
        if kind is not None and kind != want and len(values):
            raise ConvertError(f"{where}: feature {f.name!r} is a {_KIND_NAMES[kind]} list, "
                               f"the description says {f.dtype}")
        if f.dtype == BYTES:
            return values[0] if f.shape == () and len(values) == 1 else values
        arr = np.asarray(values, dtype=np.float64 if want == FLOAT_LIST else np.int64)
        dt = np.dtype(f.dtype)
        if dt.kind in "iu" and arr.size and not _fits(arr, dt):
            raise ConvertError(f"{where}: feature {f.name!r} has values outside {dt}")
        shape = (len(arr) // max(1, int(np.prod(f.row_shape))), *f.row_shape) if f.variable \
            else f.shape
        if arr.size != int(np.prod(shape)) or (f.variable and arr.size % max(
                1, int(np.prod(f.row_shape)))):
            raise ConvertError(f"{where}: feature {f.name!r} has {arr.size} values, "
                               f"shape {list(f.shape)} needs "
                               f"{'a multiple of ' if f.variable else ''}{int(np.prod(shape))}")
        return arr.astype(dt).reshape(shape)


def _fits(arr: np.ndarray, dt: np.dtype) -> bool:
    info = np.iinfo(dt)
    return int(arr.min()) >= info.min and int(arr.max()) <= info.max
