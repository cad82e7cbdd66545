"""The `aioloader` command line: inspect and cat, run as a real subprocess."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

import aioloader

from ..support.arrayrecord_util import make_records, write_theirs

RECORDS = [b"", b"\x00\xffhello", *make_records(100, 20), b"\n"]


def run(*args: str, ok: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "aioloader.tools.cli", *args],
                          capture_output=True, timeout=60, env=env)
    assert (proc.returncode == 0) == ok, proc.stderr.decode()
    return proc


@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "sample.array_record"
    with aioloader.ArrayRecordWriter(path, group_size=4) as w:
        for r in RECORDS:
            w.write(r)
    return str(path)


def test_cat_hex_is_one_line_per_record_in_file_order(sample):
    lines = run("cat", sample, "--format", "hex").stdout.decode().split("\n")
    assert lines[-1] == ""  # trailing newline
    assert [bytes.fromhex(x) for x in lines[:-1]] == RECORDS
    assert lines[0] == ""  # the empty record is an empty line
    assert lines[1] == "00ff68656c6c6f"


def test_cat_index_and_range(sample):
    assert run("cat", sample, "--index", "1", "--format", "hex").stdout == b"00ff68656c6c6f\n"
    out = run("cat", sample, "--range", "3:9", "--format", "hex").stdout.decode().split()
    assert [bytes.fromhex(x) for x in out] == RECORDS[3:9]
    last = run("cat", sample, "--index=-1", "--format", "hex").stdout
    assert last == b"0a\n"
    run("cat", sample, "--index", "99", ok=False)


def test_cat_a_read_instruction_prints_its_records(sample):
    """`path[start:end]` (array_record's read instruction; chunks of 4 records are cut)."""
    out = run("cat", sample + "[5:19]", "--format", "hex").stdout.decode().split()
    assert [bytes.fromhex(x) for x in out] == RECORDS[5:19]
    out = run("cat", sample + "[5:19]", "--range", "2:6", "--format", "hex").stdout.decode()
    assert [bytes.fromhex(x) for x in out.split()] == RECORDS[7:11]


def test_cat_json_is_lossless(sample):
    lines = run("cat", sample, "--format", "json").stdout.decode().splitlines()
    items = [json.loads(x) for x in lines]
    assert [i["index"] for i in items] == list(range(len(RECORDS)))
    assert items[1]["record_base64"] == "AP9oZWxsbw=="  # not UTF-8
    assert items[0]["record"] == "" and items[-1]["record"] == "\n"
    for item, record in zip(items, RECORDS, strict=True):
        text = item.get("record")
        raw = text.encode() if text is not None else base64.b64decode(item["record_base64"])
        assert raw == record


def test_inspect_json_matches_the_file(tmp_path):
    path = tmp_path / "theirs.array_record"
    write_theirs(path, make_records(1000, 130), "group_size:64,brotli:5")
    info = json.loads(run("inspect", "--json", str(path)).stdout)
    assert info["records"] == 130 and info["chunks"] == 3 and info["group_size"] == 64
    assert info["compression"] == "brotli" and info["compression_level"] == 5
    assert info["options"].startswith("group_size:64,")
    assert info["file_size"] == path.stat().st_size
    text = run("inspect", str(path)).stdout.decode()
    assert "records" in text and "130" in text and "brotli:5" in text


def test_errors_name_the_file_and_exit_nonzero(tmp_path):
    bad = tmp_path / "not-arrayrecord.bin"
    bad.write_bytes(b"hello" * 40_000)
    proc = run("inspect", str(bad), ok=False)
    assert b"not-arrayrecord.bin" in proc.stderr and b"Traceback" not in proc.stderr
    proc = run("cat", str(tmp_path / "missing.array_record"), ok=False)
    assert b"missing.array_record" in proc.stderr


def test_help_reads_well():
    out = run("--help").stdout.decode()
    assert "inspect" in out and "cat" in out
    assert "stable contract" in run("cat", "--help").stdout.decode()


def test_inspect_and_cat_from_a_bucket(sample):
    from aioloader.testing import local_gcs

    with local_gcs() as gcs:  # sets STORAGE_EMULATOR_HOST for the subprocess
        url = gcs.upload(sample, "dir/sample.array_record")
        info = json.loads(run("inspect", "--json", url).stdout)
        assert info["records"] == len(RECORDS) and info["path"] == url
        out = run("cat", url, "--format", "hex").stdout.decode().split("\n")[:-1]
        assert [bytes.fromhex(x) for x in out] == RECORDS
        proc = run("inspect", gcs.url("dir/absent.array_record"), ok=False)
        assert b"absent.array_record" in proc.stderr


@pytest.fixture
def shards(tmp_path):
    """Three files of 5,000 records each ("k-i"), matched by one glob."""
    for k in range(3):
        with aioloader.ArrayRecordWriter(tmp_path / f"d-{k}.array_record", group_size=4) as w:
            for i in range(5000):
                w.write(f"{k}-{i}".encode())
    return str(tmp_path / "*.array_record")


def test_inspect_a_quoted_glob_reports_every_file(shards, tmp_path):
    infos = json.loads(run("inspect", "--json", shards).stdout)
    assert [i["path"] for i in infos] == [str(tmp_path / f"d-{k}.array_record") for k in range(3)]
    assert [i["records"] for i in infos] == [5000] * 3
    text = run("inspect", shards).stdout.decode()
    assert all(f"d-{k}.array_record" in text for k in range(3)) and "*" not in text


def test_cat_numbers_records_across_the_files_of_a_glob(shards):
    out = run("cat", shards, "--range", "4998:5002", "--separator", r"\n").stdout.decode()
    assert out.split() == ["0-4998", "0-4999", "1-0", "1-1"]
    assert run("cat", shards, "--index=-1").stdout == b"2-4999"
    assert run("cat", shards, "--range", "14999:20000", "--format", "hex").stdout == \
        b"2-4999".hex().encode() + b"\n"
    proc = run("cat", shards, "--index", "15000", ok=False)
    assert b"15,000 records in 3 files" in proc.stderr and b"Traceback" not in proc.stderr


def test_a_directory_is_reported_as_one(tmp_path):
    proc = run("inspect", str(tmp_path), ok=False)
    assert b"is a directory" in proc.stderr and b"too small" not in proc.stderr
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["inspect", "cat"])
def test_a_reader_that_stops_early_gets_no_broken_pipe_message(shards, command):
    # More output than a pipe holds (64 KiB), so the writer is still writing when `head` goes.
    args = ["inspect", *[shards] * 150] if command == "inspect" else ["cat", shards]
    proc = subprocess.Popen([sys.executable, "-m", "aioloader.tools.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline()  # what `head -1` does: read a line, then close
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 0
    assert stderr == b"", stderr.decode()


def test_version():
    out = run("--version").stdout.decode()
    assert out.startswith("aioloader ") and out.split()[1][0].isdigit()


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_cat_writes_every_byte_to_a_pipe_that_takes_only_part(tmp_path, unbuffered):
    """A pipe write may take only part of what it is given (a non-blocking pipe that is full,
    a write cut short in the kernel): cat writes the rest, with PYTHONUNBUFFERED=1 (where
    stdout's binary layer is unbuffered and a short write was silently the end) and without
    it (where it was a BlockingIOError)."""
    import os
    import threading
    import time

    path = tmp_path / "big.array_record"
    records = [bytes([65 + i]) * 300_000 for i in range(4)]  # each far over a pipe's 64 KiB
    with aioloader.ArrayRecordWriter(path) as w:
        for r in records:
            w.write(r)
    r, w = os.pipe()
    os.set_blocking(w, False)  # (the same open pipe as the child's stdout: it sees it too)
    chunks: list[bytes] = []

    def drain() -> None:
        time.sleep(0.3)  # let the pipe fill first
        while data := os.read(r, 1 << 16):
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    try:
        proc = subprocess.run([sys.executable, "-m", "aioloader.tools.cli", "cat", str(path),
                               "--format", "raw"], stdout=w, stderr=subprocess.PIPE,
                              env=env, timeout=60)
    finally:
        os.close(w)
        reader.join(60)
        os.close(r)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"".join(chunks) == b"".join(records)  # raw: the bytes, nothing added


def test_inspect_and_cat_read_tfrecord(tmp_path):
    from aioloader.formats.tfrecord import frame

    path = tmp_path / "train.tfrecord-00000-of-00001"  # TFDS's names: found by the name
    path.write_bytes(b"".join(frame(r) for r in RECORDS))
    info = json.loads(run("inspect", "--json", str(path)).stdout)
    assert info["format"] == "tfrecord" and info["records"] == len(RECORDS)
    assert info["chunks"] == len(RECORDS) and info["group_size"] == 1
    assert info["compression"] == "none" and info["file_size"] == path.stat().st_size
    assert "tfrecord" in run("inspect", str(path)).stdout.decode()
    out = run("cat", str(path), "--format", "hex").stdout.decode().split("\n")[:-1]
    assert [bytes.fromhex(x) for x in out] == RECORDS
    other = tmp_path / "data.bin"  # any name, with --from
    other.write_bytes(path.read_bytes())
    assert run("cat", str(other), "--from", "tfrecord", "--index", "1").stdout == RECORDS[1]
    proc = run("cat", str(other), ok=False)  # read as ArrayRecord: an error, not records
    assert b"data.bin" in proc.stderr and b"Traceback" not in proc.stderr


def test_inspect_and_cat_read_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"  # found by the name
    pq.write_table(pa.table({"id": list(range(30)), "name": [f"n{i}" for i in range(30)],
                             "raw": [b"\x00\xff"] * 30}), path, row_group_size=8,
                   compression="zstd")
    info = json.loads(run("inspect", "--json", str(path)).stdout)
    assert info["format"] == "parquet" and info["records"] == 30
    assert info["chunks"] == 4 and info["compression"] == "zstd"
    lines = run("cat", str(path), "--format", "json", "--range", "9:11").stdout.splitlines()
    assert [json.loads(x) for x in lines] == [
        {"index": i, "row": {"id": i, "name": f"n{i}", "raw": {"base64": "AP8="}}}
        for i in (9, 10)]
    other = tmp_path / "rows.bin"  # any name, with --from
    other.write_bytes(path.read_bytes())
    one = run("cat", str(other), "--from", "parquet", "--format", "json", "--index", "-1")
    assert json.loads(one.stdout)["row"]["id"] == 29
    proc = run("cat", str(path), ok=False)  # rows are not bytes: said so, no traceback
    assert b"--format json" in proc.stderr and b"Traceback" not in proc.stderr
