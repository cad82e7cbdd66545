"""`aioloader convert` run as a real subprocess where things go wrong: secrets in URLs,
leftovers of a killed run, a corrupt TFRecord length, a quoted glob, an output that cannot be
written, a full disk. Each error must name what failed and print no credential."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from aioloader.formats.tfrecord import masked_crc as _masked_crc
from aioloader.tools.convert import ConvertError, read_records, write_tfrecord

from ..support.arrayrecord_util import read_theirs

RECORDS = [json.dumps({"i": i, "text": "x" * (i % 50)}).encode() for i in range(500)]
SECRET = "S3KRIT"


def cli(*args: str, ok: bool = True, timeout: float = 120) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, "-m", "aioloader.tools.cli", "convert", *args, "-q"],
                          capture_output=True, timeout=timeout)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert (proc.returncode == 0) == ok, err[-3000:]
    if not ok:
        assert "Traceback" not in err, err  # one line naming what failed, not a traceback
    return out, err


def free_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jsonl(path, records=RECORDS) -> str:
    path.write_bytes(b"\n".join(records) + b"\n")
    return str(path)


# -- secrets ---------------------------------------------------------------------------


def test_an_input_url_secret_is_never_printed(tmp_path):
    url = f"http://user:{SECRET}1@127.0.0.1:{free_port()}/x.jsonl?X-Goog-Signature={SECRET}2"
    out, err = cli("--from", "jsonl", url, str(tmp_path / "o"), ok=False)
    assert SECRET not in out + err, err
    assert "http://***@127.0.0.1" in err and "X-Goog-Signature=***" in err, err


def test_a_bucket_output_takes_no_query_and_loses_its_leftovers(tmp_path):
    from aioloader.testing import local_gcs

    src = jsonl(tmp_path / "in.jsonl")
    with local_gcs() as gcs:
        out, err = cli(src, gcs.url("c/train") + f"?X-Goog-Signature={SECRET}", ok=False)
        assert SECRET not in out + err, err
        assert "query" in err and "X-Goog-Signature=***" in err, err
        assert gcs.list_objects("c/") == {}  # no object named after the signature
        # What a run killed while moving its shards into place left is removed, and said.
        orphan = "c/.train-00001-of-00002.array_record.0123456789abcdef.tmp"
        gcs.upload_bytes(b"half", orphan)
        gcs.upload_bytes(b"theirs", "c/.other-00000-of-00001.array_record.0123456789abcdef.tmp")
        _, err = cli(src, gcs.url("c/train"), "--shards", "2")
        assert "removed 1 temporary file" in err and gcs.url(orphan) in err, err
        assert sorted(gcs.list_objects("c/")) == [
            "c/.other-00000-of-00001.array_record.0123456789abcdef.tmp",
            "c/train-00000-of-00002.array_record", "c/train-00001-of-00002.array_record"]


# -- leftovers of a killed conversion ----------------------------------------------------


def _temps(d) -> list[str]:
    return sorted(name for name in os.listdir(d) if name.endswith(".tmp"))


def _start_and_stop(src, prefix) -> subprocess.Popen:
    """The real CLI converting `src`, stopped (SIGSTOP) once its two temporary shards exist."""
    d = os.path.dirname(prefix)
    before = set(_temps(d))
    proc = subprocess.Popen([sys.executable, "-m", "aioloader.tools.cli", "convert", src, prefix,
                             "--shards", "2", "--overwrite", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(set(_temps(d)) - before) < 2:
        assert proc.poll() is None, "it finished before its temporaries were seen"
        assert time.monotonic() < deadline, "no temporary shard appeared"
        time.sleep(0.005)
    proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None and len(set(_temps(d)) - before) == 2
    return proc


def test_temporaries_of_a_killed_run_are_removed_by_the_next_and_reported(tmp_path):
    big = jsonl(tmp_path / "big.jsonl", [b'{"i": %d}' % i for i in range(20000)])
    prefix = str(tmp_path / "train")
    killed = _start_and_stop(big, prefix)
    leftovers = _temps(tmp_path)
    live = _start_and_stop(big, prefix)  # a conversion still running keeps its temporaries
    theirs = sorted(set(_temps(tmp_path)) - set(leftovers))
    killed.kill()
    killed.wait()
    assert _temps(tmp_path) == sorted(leftovers + theirs)
    try:
        good = jsonl(tmp_path / "good.jsonl")
        _, err = cli(good, prefix, "--shards", "2", "--overwrite")
        assert _temps(tmp_path) == theirs  # the killed run's are gone, the live run's kept
    finally:
        live.kill()
        live.wait()
    assert "removed 2" in err and all(name in err for name in leftovers), err
    assert not any(name in err for name in theirs) and "another conversion" in err, err
    assert read_theirs(tmp_path / "train-00001-of-00002.array_record") == RECORDS[1::2]
    cli(good, prefix, "--shards", "2", "--overwrite")  # the live run's too, now it is gone
    assert _temps(tmp_path) == []


# -- input -----------------------------------------------------------------------------


def test_a_tfrecord_length_past_the_end_of_the_file_is_an_error_naming_it(tmp_path):
    head = struct.pack("<Q", 1 << 62)
    plain = tmp_path / "huge.tfrecord"
    with open(plain, "wb") as f:
        write_tfrecord(f, RECORDS[:3])
        at = f.tell()
        f.write(head + struct.pack("<I", _masked_crc(head)) + b"x" * 100)
    packed = tmp_path / "huge.tfrecord.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    _, err = cli(str(plain), str(tmp_path / "o"), ok=False)
    assert plain.name in err and f"byte {at}" in err and "MemoryError" not in err, err
    assert _temps(tmp_path) == []
    # Compressed, the size is unknown: the record is read in pieces until the stream ends.
    with pytest.raises(ConvertError, match=rf"huge\.tfrecord\.gz: .* byte {at} is truncated"):
        list(read_records(str(packed), "tfrecord"))


def test_a_quoted_glob_input_is_expanded_in_sorted_order(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for k in (1, 0):
        with open(d / f"part-{k}.tfrecord", "wb") as f:
            write_tfrecord(f, RECORDS[k * 250:(k + 1) * 250])
    out, _ = cli(str(d / "*.tfrecord"), str(tmp_path / "g"))
    assert "wrote 500 records" in out
    assert read_theirs(tmp_path / "g-00000-of-00001.array_record") == RECORDS
    _, err = cli(str(d / "*.jsonl"), str(tmp_path / "h"), ok=False)
    assert "*.jsonl" in err and "no file matches" in err, err


# -- output ----------------------------------------------------------------------------


def test_an_http_output_reports_why_it_cannot_be_written(tmp_path):
    src = jsonl(tmp_path / "in.jsonl")
    url = f"http://127.0.0.1:{free_port()}/out"
    _, err = cli(src, url, ok=False)
    assert f"{url}-00000-of-00001.array_record" in err and "cannot write" in err, err
    assert "NotImplementedError" not in err


def _small_filesystem_works() -> bool:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                               "mount -t tmpfs -o size=64k tmpfs /mnt"],
                              capture_output=True, timeout=30).returncode == 0
    return False


@pytest.mark.skipif(not _small_filesystem_works(), reason="cannot mount a tmpfs here")
def test_a_full_disk_names_the_output_and_leaves_nothing(tmp_path):
    noise = [b'"%s"' % os.urandom(600).hex().encode() for _ in range(2000)]  # 2.4 MB
    src = jsonl(tmp_path / "in.jsonl", noise)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} || exit 99; "
              f'"$0" -m aioloader.tools.cli convert {src} {mnt}/train --from jsonl -q '
              f"--compression uncompressed; echo rc=$?; ls -A {mnt}")
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script, sys.executable], capture_output=True, timeout=120)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert out.splitlines()[0] == "rc=1", out + err
    assert out.splitlines()[1:] == [], out  # the temporary is gone
    assert "No space left" in err and f"{mnt}/train-00000-of-00001.array_record" in err, err
    assert "Traceback" not in err, err


def test_an_input_whose_literal_name_has_glob_characters_wins_over_the_glob(tmp_path):
    """`data[12].jsonl` that exists is that file, not data1.jsonl and data2.jsonl (a file of
    the literal name wins, as for read instructions)."""
    from aioloader.tools.convert import expand_inputs

    for name in ("data[12].jsonl", "data1.jsonl", "data2.jsonl"):
        (tmp_path / name).write_text('{"x": 1}\n')
    literal = str(tmp_path / "data[12].jsonl")
    assert expand_inputs([literal]) == [literal]
    assert expand_inputs([str(tmp_path / "data?.jsonl")]) == \
        [str(tmp_path / "data1.jsonl"), str(tmp_path / "data2.jsonl")]
