"""`aioloader convert` and `aioloader bench`: real files in, array_record/Grain read them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from aioloader.tools.convert import ConvertError, convert, read_tfrecord, write_tfrecord

from ..support.arrayrecord_util import read_theirs

RECORDS = [json.dumps({"i": i, "text": "x" * (i % 50)}).encode() for i in range(500)]


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "aioloader.tools.cli", *args], capture_output=True,
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


# -- existing output is never destroyed ------------------------------------------------


def _snapshot(root) -> dict[str, bytes | str]:
    """Every name under `root` (hidden ones too): file bytes, or a symlink's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p)] = f"-> {os.readlink(p)}"
        elif p.is_file():
            out[str(p)] = p.read_bytes()
    return out


def _fails_late(tmp_path):
    """Input whose line 1501 is not JSON: by then every shard has data written."""
    bad = tmp_path / "in" / "late.jsonl"
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(b"\n".join(RECORDS * 3) + b"\nnot json\n")
    return str(bad)


def test_a_failed_conversion_never_touches_existing_output(tmp_path):
    good = tmp_path / "in" / "good.jsonl"
    good.parent.mkdir()
    good.write_bytes(b"\n".join(RECORDS))
    out = tmp_path / "out"
    convert([str(good)], str(out / "train"), shards=3)
    before = _snapshot(out)
    assert len(before) == 3
    # Refused (existing output) or failed (bad input): either way nothing changes.
    with pytest.raises((ConvertError, FileExistsError)):
        convert([_fails_late(tmp_path)], str(out / "train"), shards=3)
    assert _snapshot(out) == before
    with pytest.raises(ConvertError, match="line 1501"):
        convert([_fails_late(tmp_path)], str(out / "train"), shards=3, overwrite=True)
    assert _snapshot(out) == before  # no temporaries left either

    def interrupt(records, size):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert([str(good)], str(out / "train"), shards=3, overwrite=True, progress=interrupt)
    assert _snapshot(out) == before


def test_existing_output_is_refused_without_overwrite(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(RECORDS))
    prefix = str(tmp_path / "o")
    cli("convert", str(src), prefix, "--shards", "2", "-q")
    shard = tmp_path / "o-00001-of-00002.array_record"
    before = shard.read_bytes()
    src.write_bytes(b"\n".join(RECORDS[:10]))
    proc = cli("convert", str(src), prefix, "--shards", "2", "-q", ok=False)
    err = proc.stderr.decode()
    assert str(shard) in err and "o-00000-of-00002" in err and "--overwrite" in err, err
    assert shard.read_bytes() == before
    cli("convert", str(src), prefix, "--shards", "2", "-q", "--overwrite")
    assert read_theirs(shard) == RECORDS[1:10:2]


def test_a_symlink_at_an_output_path_is_never_written_through(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(RECORDS))
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    out = tmp_path / "s-00000-of-00002.array_record"
    dangling = tmp_path / "s-00001-of-00002.array_record"
    os.symlink(victim, out)
    os.symlink(tmp_path / "ghost", dangling)
    with pytest.raises(FileExistsError, match=r"s-00000-of-00002.*s-00001-of-00002.*overwrite"):
        convert([str(src)], str(tmp_path / "s"), shards=2)
    assert victim.read_bytes() == b"precious" and not (tmp_path / "ghost").exists()
    assert out.is_symlink() and dangling.is_symlink()
    convert([str(src)], str(tmp_path / "s"), shards=2, overwrite=True)
    assert victim.read_bytes() == b"precious" and not (tmp_path / "ghost").exists()
    assert not out.is_symlink() and not dangling.is_symlink()
    assert read_theirs(out) == RECORDS[0::2] and read_theirs(dangling) == RECORDS[1::2]


def test_bucket_output_is_refused_or_replaced_whole(tmp_path):
    from aioloader.testing import local_gcs

    good = tmp_path / "in" / "good.jsonl"
    good.parent.mkdir()
    good.write_bytes(b"\n".join(RECORDS))
    with local_gcs() as gcs:
        convert([str(good)], gcs.url("c/train"), shards=2)
        before = gcs.list_objects("c/")
        assert sorted(before) == ["c/train-00000-of-00002.array_record",
                                  "c/train-00001-of-00002.array_record"]
        with pytest.raises(FileExistsError, match=r"train-00000-of-00002.*--overwrite"):
            convert([str(good)], gcs.url("c/train"), shards=2)
        with pytest.raises(ConvertError, match="line 1501"):
            convert([_fails_late(tmp_path)], gcs.url("c/train"), shards=2, overwrite=True)
        assert gcs.list_objects("c/") == before  # same sizes, no temporaries
        convert([str(tmp_path / "in" / "good.jsonl")], gcs.url("c/train"), shards=2,
                overwrite=True)
        assert gcs.list_objects("c/") == before
        out = cli("cat", gcs.url("c/train-00001-of-00002.array_record"), "--format", "hex")
    assert out.stdout.decode().split() == [r.hex() for r in RECORDS[1::2]]


def test_output_that_appears_during_the_conversion_is_not_replaced(tmp_path):
    src = tmp_path / "in" / "big.jsonl"
    src.parent.mkdir()
    src.write_bytes(b"\n".join(RECORDS * 3))
    late = tmp_path / "l-00001-of-00002.array_record"

    def someone_else_writes(records, size):
        if not late.exists():
            late.write_bytes(b"theirs")

    with pytest.raises(FileExistsError, match="l-00001-of-00002"):
        convert([str(src)], str(tmp_path / "l"), shards=2, progress=someone_else_writes)
    assert late.read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", late.name]  # all or nothing
