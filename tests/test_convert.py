"""`aioloader convert` and `aioloader bench`: real files in, array_record/Grain read them."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

from aioloader.convert import ConvertError, convert, read_tfrecord, write_tfrecord

from .arrayrecord_util import read_theirs

RECORDS = [json.dumps({"i": i, "text": "x" * (i % 50)}).encode() for i in range(500)]


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "aioloader.cli", *args], capture_output=True,
                          timeout=120)
    assert (proc.returncode == 0) == ok, proc.stderr.decode()[-2000:]
    return proc


def test_jsonl_to_shards_readable_by_array_record_and_grain(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(RECORDS) + b"\n\n")
    out = cli("convert", str(src), str(tmp_path / "out" / "train"), "--shards", "3", "-q")
    assert b"wrote 500 records" in out.stdout
    shards = [tmp_path / "out" / f"train-{k:05d}-of-00003.array_record" for k in range(3)]
    for k, shard in enumerate(shards):
        assert read_theirs(shard) == RECORDS[k::3]
    grain_sources = pytest.importorskip("grain.sources")
    src = grain_sources.ArrayRecordDataSource([str(s) for s in shards])
    assert [src[i] for i in range(len(src))] == RECORDS[0::3] + RECORDS[1::3] + RECORDS[2::3]


def test_tfrecord_roundtrip_and_checksums(tmp_path):
    path = tmp_path / "data.tfrecord"
    with open(path, "wb") as f:
        write_tfrecord(f, RECORDS)
    convert([str(path)], str(tmp_path / "t"), shards=2, compression="snappy")
    got = read_theirs(tmp_path / "t-00000-of-00002.array_record")
    assert got == RECORDS[0::2]
    damaged = bytearray(path.read_bytes())
    damaged[14] ^= 1  # inside the first record's data
    with pytest.raises(ConvertError, match=r"checksum mismatch.* byte 0"):
        list(read_tfrecord(io.BytesIO(bytes(damaged)), "data.tfrecord"))
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(damaged))
    proc = cli("convert", str(bad), str(tmp_path / "b"), "-q", ok=False)
    assert b"bad.tfrecord" in proc.stderr and b"checksum" in proc.stderr
    assert not list(tmp_path.glob("b-*.array_record"))  # no half-written shards left


def test_npy_rows_become_records(tmp_path):
    arr = np.arange(60, dtype=np.float32).reshape(10, 3, 2)
    np.save(tmp_path / "x.npy", arr)
    convert([str(tmp_path / "x.npy")], str(tmp_path / "n"))
    got = read_theirs(tmp_path / "n-00000-of-00001.array_record")
    assert [np.frombuffer(g, np.float32).reshape(3, 2).tolist() for g in got] == arr.tolist()


def test_convert_to_a_bucket_and_bench_it(tmp_path):
    from aioloader.testing import local_gcs

    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(RECORDS))
    with local_gcs() as gcs:
        convert([str(src)], gcs.url("c/train"), shards=2)
        out = cli("bench", gcs.url("c/train-*.array_record"), "--pipeline", "text", "-q",
                  "--batch", "50", "--workers", "0")
    text = out.stdout.decode()
    assert "time to first batch" in text and "records/s" in text and "500 records" in text


def test_unknown_format_and_bad_json(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x")
    with pytest.raises(ConvertError, match="--from"):
        convert([str(tmp_path / "a.bin")], str(tmp_path / "o"))
    (tmp_path / "b.jsonl").write_bytes(b'{"ok": 1}\nnot json\n')
    with pytest.raises(ConvertError, match=r"b\.jsonl: line 2"):
        convert([str(tmp_path / "b.jsonl")], str(tmp_path / "o"))


def test_cli_help_lists_every_command():
    out = cli("--help").stdout.decode()
    for cmd in ("inspect", "cat", "convert", "bench"):
        assert cmd in out
    assert "round-robin" in cli("convert", "--help").stdout.decode()
