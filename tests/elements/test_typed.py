"""Records that know their type: the element spec in the footer, its codec, `decode="auto"`,
and typed conversion of .npy and tf.train.Example inputs (issue 18 §3)."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioloader as al
from aioloader.elements.tfexample import (
    ExampleDecoder,
    encode_example,
    parse_example,
    parse_features,
)
from aioloader.elements.typed import ElementSpec
from aioloader.tools.convert import ConvertError, convert, write_tfrecord

from ..support.arrayrecord_util import read_theirs

DTYPES = ["<f4", "<f8", "<i8", "<i4", "|u1", "<u2", "|b1", "<c8", ">i4", "<f2"]


def _batches(path, **kw):
    ds = al.Dataset.from_arrayrecord(path, decode="auto").batch(kw.pop("batch", 4))
    return list(ds.loader(workers=kw.pop("workers", 0), **kw))


# -- the codec --------------------------------------------------------------------------

@st.composite
def spec_and_element(draw):
    def field(name):
        if draw(st.booleans()) and name is not None:
            shape = draw(st.sampled_from([(), (-1,), (2,)]))
            n = {(): 1, (-1,): draw(st.integers(0, 4)), (2,): 2}[shape]
            items = draw(st.lists(st.binary(max_size=300), min_size=n, max_size=n))
            return ("bytes", shape), items[0] if shape == () else items
        dt = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        rows = draw(st.integers(0, 5))
        # variable rows may not be empty (a record could not bound their count: refused)
        variable = draw(st.booleans()) and 0 not in shape
        full = (rows, *shape) if variable else shape
        raw = draw(st.binary(min_size=int(np.prod(full)) * np.dtype(dt).itemsize,
                             max_size=int(np.prod(full)) * np.dtype(dt).itemsize))
        return (dt, (-1, *shape) if variable else shape), np.frombuffer(raw, dt).reshape(full)

    if draw(st.booleans()):
        (dt, shape), value = field(None)
        return ElementSpec.array(dt, shape), value
    names = draw(st.lists(st.text("abcxyz_", min_size=1, max_size=4), min_size=1, max_size=4,
                          unique=True))
    parts = {n: field(n) for n in names}
    return ElementSpec.of({n: p[0] for n, p in parts.items()}), {n: p[1] for n, p in
                                                                parts.items()}


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, bytes):
        return a == b
    if isinstance(a, list) or isinstance(b, list) or getattr(a, "dtype", None) is np.dtype(object):
        return list(a) == list(b)  # strings (np.asarray would strip their trailing NULs)
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_and_element())
def test_encode_then_decode_gives_the_element_back(case):
    spec, element = case
    record = spec.encode(element)
    assert _same(spec.decode(record), element)
    assert ElementSpec.from_json(spec.to_json()) == spec
    if spec.single:  # one array: the record is its raw bytes, as `convert --from npy` wrote
        assert record == np.ascontiguousarray(element).tobytes()


@settings(max_examples=200, deadline=None)
@given(spec_and_element(), st.binary(max_size=64), st.integers(0, 64))
def test_a_damaged_record_is_a_clear_error_never_a_crash(case, junk, cut):
    spec, element = case
    record = spec.encode(element)
    for bad in (record[: max(0, len(record) - 1 - cut)], record + junk[:1] + junk, junk):
        with contextlib.suppress(al.ElementSpecError):
            spec.decode(bad)


@pytest.mark.parametrize("text, what", [
    ("{", "not JSON"),
    ('{"version": 2, "fields": []}', "not a version 1"),
    ('{"version": 1, "fields": []}', "0 fields"),
    ('{"version": 1, "fields": [{"name": null, "dtype": "O", "shape": []}]}',
     "not a plain number type"),
    ('{"version": 1, "fields": [{"name": null, "dtype": "<U4", "shape": []}]}',
     "not a plain number type"),
    ('{"version": 1, "fields": [{"name": null, "dtype": "f4,i4", "shape": []}]}',
     "not a plain number type"),
    ('{"version": 1, "fields": [{"name": null, "dtype": "nonsense", "shape": []}]}',
     "not a numpy dtype"),
    ('{"version": 1, "fields": [{"name": null, "dtype": "<f8", "shape": [1000000, 1000000]}]}',
     "more than any record holds"),
    ('{"version": 1, "fields": [{"name": null, "dtype": "<f8", "shape": [3, -1]}]}',
     r"-1 \(variable\) allowed only first"),
    ('{"version": 1, "fields": [{"name": null, "dtype": "<f8", "shape": [1.5]}]}', "sizes"),
    ('{"version": 1, "fields": [{"name": "a", "dtype": "<f8", "shape": []},'
     ' {"name": "a", "dtype": "<f8", "shape": []}]}', "names repeat"),
    ('{"version": 1, "fields": [{"name": "a", "dtype": "bytes", "shape": [2, 2]}]}',
     "scalar or a list"),
    ('{"version": 1, "fields": [{"name": "a", "dtype": "<f4", "shape": [-1, 0]}]}',
     "rows of 0 bytes"),
    ('{"version": 1, "fields": [{"name": "a", "dtype": null, "shape": [2]}]}',
     r"field 'a'.*dtype None is not a dtype name"),  # np.dtype(None) is float64
    ('{"version": 1, "fields": [{"name": "a", "dtype": "f16", "shape": [2]}]}',
     r"field 'a'.*'f16'.*different machines"),  # extended precision: float128 here
    ('{"version": 1, "fields": [{"name": "a", "dtype": "int", "shape": [2]}]}',
     r"field 'a'.*'int'.*different machines"),
    ('{"version": true, "fields": [{"name": null, "dtype": "<f4", "shape": []}]}',
     "its version is True"),
    ('{"version": 1.0, "fields": [{"name": null, "dtype": "<f4", "shape": []}]}',
     "its version is 1.0"),
    ('{"version": 1, "fields": [' + "[" * 100_000 + "]" * 100_000 + "]}",
     "nested too deeply"),
])
def test_hostile_specs_in_a_file_are_refused_naming_the_file(tmp_path, text, what):
    path = tmp_path / "bad.array_record"
    with al.ArrayRecordWriter(path, element_spec=text) as w:
        w.write(b"\0" * 8)
    assert read_theirs(path) == [b"\0" * 8]  # array_record skips the unknown field
    with pytest.raises(al.ElementSpecError, match=what) as err:
        al.Dataset.from_arrayrecord(path, decode="auto")
    assert "bad.array_record" in str(err.value)


def test_a_record_that_does_not_fit_its_spec_names_the_record(tmp_path):
    path = tmp_path / "short.array_record"
    with al.ArrayRecordWriter(path, element_spec=ElementSpec.array("<f4", (4,))) as w:
        for k in range(6):
            w.write(np.zeros(4, np.float32) if k != 3 else b"\0" * 12)
    for workers in (0, 1):
        with pytest.raises(Exception, match=r"(?s)record 3.*12 bytes.*needs 16"):
            _batches(path, batch=1, workers=workers)


# -- files: written, read back, checked against array_record -----------------------------

def test_writer_records_the_spec_and_array_record_still_reads_the_file(tmp_path):
    spec = ElementSpec.of({"x": ("float32", (2, 3)), "tokens": ("int64", (-1,)),
                           "name": ("bytes", ())})
    elements = [{"x": np.full((2, 3), k, np.float32), "tokens": np.arange(k),
                 "name": b"n%d" % k} for k in range(10)]
    path = tmp_path / "t.array_record"
    with al.ArrayRecordWriter(path, group_size=3, element_spec=spec) as w:
        for e in elements:
            w.write(e)
    theirs = read_theirs(path)
    assert [spec.encode(e) for e in elements] == theirs
    with al.ArrayRecordSource(path) as src:
        assert src.element_spec == spec
        assert _same(spec.decode(src[7]), elements[7])
    got = [e for e in al.Dataset.from_arrayrecord(path, decode="auto").loader(workers=0)]
    assert all(_same(a, b) for a, b in zip(got, elements)) and len(got) == 10
    out = subprocess.run([sys.executable, "-m", "aioloader.tools.cli", "inspect", str(path)],
                         capture_output=True, timeout=60, check=True).stdout.decode()
    assert "element spec" in out and '"tokens"' in out


def test_files_that_disagree_or_lack_a_spec_are_refused_by_name(tmp_path):
    for name, spec in (("a", ElementSpec.array("<f4", (2,))), ("b", ElementSpec.array("<f8", (2,))),
                       ("c", None)):
        with al.ArrayRecordWriter(tmp_path / f"{name}.array_record", element_spec=spec) as w:
            w.write(b"\0" * 16 if name == "b" else b"\0" * 8)
    with pytest.raises(al.ElementSpecError, match=r"b\.array_record: records <f8\[2\]"):
        al.Dataset.from_arrayrecord([str(tmp_path / "a.array_record"),
                                     str(tmp_path / "b.array_record")], decode="auto")
    with pytest.raises(al.ElementSpecError, match=r"c\.array_record: records no element spec"):
        al.Dataset.from_arrayrecord([str(tmp_path / "a.array_record"),
                                     str(tmp_path / "c.array_record")], decode="auto")
    with pytest.raises(al.ElementSpecError, match="record no element spec"):
        al.Dataset.from_arrayrecord(str(tmp_path / "c.array_record"), decode="auto")
    # An explicit spec needs no recorded one, and opens nothing.
    ds = al.Dataset.from_arrayrecord(tmp_path / "c.array_record",
                                     decode=ElementSpec.array("|u1", (-1,)))
    assert [e.tolist() for e in ds.loader(workers=0)] == [[0] * 8]


def test_the_index_cache_keeps_the_spec(tmp_path):
    spec = ElementSpec.array("<i2", (3,))
    path = tmp_path / "c.array_record"
    with al.ArrayRecordWriter(path, element_spec=spec) as w:
        w.write(np.arange(3, dtype="<i2"))
    for _ in range(2):  # the second open reads the cache
        with al.ArrayRecordSource(path, index_cache_dir=tmp_path / "cache") as src:
            assert src.element_spec == spec
    assert list((tmp_path / "cache").iterdir())


# -- conversion ---------------------------------------------------------------------------

def test_npy_conversion_round_trips_to_arrays_of_the_right_dtype_and_shape(tmp_path):
    arrays = [np.random.default_rng(k).normal(size=(37, 4, 5)).astype(np.float16)
              for k in range(2)]
    inputs = []
    for k, a in enumerate(arrays):
        inputs.append(str(tmp_path / f"in{k}.npy"))
        np.save(inputs[-1], a)
    out = convert(inputs, str(tmp_path / "out" / "x"), shards=3)
    assert out["element_spec"] == ElementSpec.array("<f2", (4, 5))
    rows = np.concatenate(arrays)
    got = np.concatenate(_batches(str(tmp_path / "out" / "x-*"), batch=5, workers=1))
    assert got.dtype == np.float16 and got.shape == (74, 4, 5)
    # shards are dealt round-robin: the files hold rows 0,3,6..., then 1,4,..., then 2,5,...
    assert np.array_equal(got, np.concatenate([rows[k::3] for k in range(3)]))
    assert read_theirs(out["outputs"][0])[1] == rows[3].tobytes()  # still raw bytes


def test_npy_inputs_of_different_rows_convert_untyped(tmp_path, caplog):
    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.int32))
    np.save(tmp_path / "b.npy", np.zeros((2, 4), np.int32))
    out = convert([str(tmp_path / "a.npy"), str(tmp_path / "b.npy")], str(tmp_path / "o"))
    assert out["element_spec"] is None and "no element spec" in caplog.text


def _examples(n: int) -> list[dict]:
    return [{"image": b"\x89PNG" + bytes([k]) * k, "label": k % 7 - 3,
             "embedding": [k * 0.5, -1.0, 2.25], "tokens": list(range(k % 4))}
            for k in range(n)]


def _tfrecord(tmp_path, examples, name="in.tfrecord"):
    path = tmp_path / name
    with open(path, "wb") as f:
        write_tfrecord(f, [encode_example(e) for e in examples])
    return str(path)


def test_example_conversion_round_trips_to_named_arrays(tmp_path):
    examples = _examples(20)
    src = _tfrecord(tmp_path, examples)
    out = convert([src], str(tmp_path / "o" / "ex"), shards=1,
                  decode_examples="image:bytes,label:int32,embedding:float32[3],"
                                  "tokens:int64[-1]")
    assert str(out["element_spec"]) == \
        "{image: bytes[], label: <i4[], embedding: <f4[3], tokens: <i8[None]}"
    got = list(al.Dataset.from_arrayrecord(out["outputs"][0], decode="auto").loader(workers=1))
    assert len(got) == 20
    for g, e in zip(got, examples):
        assert g["image"] == e["image"]
        assert g["label"].dtype == np.int32 and g["label"].shape == () and g["label"] == e["label"]
        assert g["embedding"].dtype == np.float32 and g["embedding"].tolist() == e["embedding"]
        assert g["tokens"].dtype == np.int64 and g["tokens"].tolist() == e["tokens"]


def test_example_conversion_takes_the_first_examples_features_or_names_the_misfit(tmp_path):
    fixed = [{"label": k, "score": [k / 2, 1.0]} for k in range(5)]
    out = convert([_tfrecord(tmp_path, fixed)], str(tmp_path / "a"), decode_examples=True)
    assert str(out["element_spec"]) == "{label: <i8[], score: <f4[2]}"
    got = _batches(out["outputs"][0], batch=5)[0]
    assert got["label"].tolist() == list(range(5)) and got["score"].shape == (5, 2)
    # The first Example has no tokens... the second does: a clear error naming the record.
    src = _tfrecord(tmp_path, _examples(5), "var.tfrecord")
    with pytest.raises(ConvertError, match=r"var\.tfrecord: record 1: .*--features"):
        convert([src], str(tmp_path / "b"), decode_examples=True)
    assert not list(tmp_path.glob("b-*"))
    with pytest.raises(ConvertError, match=r"record 0 lacks feature 'nope'"):
        convert([src], str(tmp_path / "c"), decode_examples="nope:int64")
    with pytest.raises(ConvertError, match=r"'label' is a int64 list, the description says"):
        convert([src], str(tmp_path / "c"), decode_examples="label:float32")
    with pytest.raises(ConvertError, match=r"values outside uint8"):
        convert([src], str(tmp_path / "c"), decode_examples="label:uint8")
    with pytest.raises(ConvertError, match=r"not a tf\.train\.Example"):
        convert([str(_junk(tmp_path))], str(tmp_path / "c"), decode_examples=True)


def _junk(tmp_path):
    path = tmp_path / "junk.tfrecord"
    with open(path, "wb") as f:
        write_tfrecord(f, [b"\x0a\xff\xff"])  # a field that runs past its message
    return path


def test_cli_convert_decode_examples(tmp_path):
    src = _tfrecord(tmp_path, [{"label": k, "w": [1.0, 2.0]} for k in range(3)])
    proc = subprocess.run([sys.executable, "-m", "aioloader.tools.cli", "convert", src,
                           str(tmp_path / "o"), "--decode-examples", "--features",
                           "label:int16,w:float64[2]", "-q"], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"element spec: {label: <i2[], w: <f8[2]}" in proc.stdout
    got = _batches(str(tmp_path / "o-*"), batch=3)[0]
    assert got["label"].dtype == np.int16 and got["w"].dtype == np.float64


def test_unpacked_and_negative_values_parse_as_protobuf_writes_them():
    # label: int64_list with two unpacked values (-1, 5); f: float_list with one unpacked value
    def field(n, wire, payload):
        return bytes([n << 3 | wire]) + payload

    def sized(n, payload):
        return field(n, 2, bytes([len(payload)]) + payload)

    ints = sized(3, field(1, 0, b"\xff" * 9 + b"\x01") + field(1, 0, b"\x05"))
    floats = sized(2, field(1, 5, b"\x00\x00\xc0\x3f"))

    def entry(name, feature):
        body = field(1, 2, bytes([len(name)]) + name) + field(2, 2, bytes([len(feature)]) +
                                                              feature)
        return field(1, 2, bytes([len(body)]) + body)

    feats = entry(b"label", ints) + entry(b"f", floats)
    example = field(1, 2, bytes([len(feats)]) + feats)
    got = parse_example(example)
    assert list(got["label"][1]) == [-1, 5] and list(got["f"][1]) == [1.5]


def test_examples_made_by_tensorflow_parse_the_same():
    tf = pytest.importorskip("tensorflow")
    feature = {"img": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"ab", b""])),
               "f": tf.train.Feature(float_list=tf.train.FloatList(value=[0.25, -3.0])),
               "i": tf.train.Feature(int64_list=tf.train.Int64List(value=[-(2**63), 2**63 - 1]))}
    raw = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    got = parse_example(raw)
    assert got["img"][1] == [b"ab", b""]
    assert list(got["f"][1]) == [0.25, -3.0] and list(got["i"][1]) == [-(2**63), 2**63 - 1]
    assert list(parse_example(encode_example({"i": [-(2**63), 2**63 - 1]}))["i"][1]) == \
        [-(2**63), 2**63 - 1]
    spec = parse_features("img:bytes[-1],f:float32[2],i:int64[2]")
    assert _same(spec.decode(ExampleDecoder(spec)(raw, "p", 0)),
                 {"img": np.array([b"ab", b""], dtype=object), "f": np.array([0.25, -3.0],
                  np.float32), "i": np.array([-(2**63), 2**63 - 1])})


def test_writer_refuses_a_non_bytes_record_without_a_spec(tmp_path):
    with al.ArrayRecordWriter(io.BytesIO()) as w, pytest.raises(TypeError, match="element_spec"):
        w.write(np.zeros(3))
