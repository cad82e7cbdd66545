"""The `aioloader` command in a shell: raw bytes and .npy out of `cat`, storage options,
progress bars only on a terminal, `--range -2:`, what `bench` prints, a quick `--version`.
Each runs the real command in a subprocess (`test_cli.run`)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader
from aioloader.tools.cli_common import scrub

from .test_cli import run

FLOATS = [np.arange(k, k + 3, dtype=np.float32).tobytes() for k in range(5)]  # 12 bytes each


def write(path, records, group_size: int = 2) -> str:
    with aioloader.ArrayRecordWriter(path, group_size=group_size) as w:
        for r in records:
            w.write(r)
    return str(path)


# -- cat --format raw: the bytes, nothing added ----------------------------------------


def test_cat_raw_writes_the_records_bytes_and_nothing_else(tmp_path):
    path = write(tmp_path / "f.array_record", FLOATS)
    assert run("cat", path, "--format", "raw").stdout == b"".join(FLOATS)
    assert run("cat", path).stdout == b"".join(FLOATS)  # raw is the default
    out = run("cat", path, "--format", "raw", "--separator", r"\n").stdout
    assert out == b"".join(r + b"\n" for r in FLOATS)
    out = run("cat", path, "--separator", r"\0", "--range", "1:3").stdout
    assert out == FLOATS[1] + b"\0" + FLOATS[2] + b"\0"
    out = run("cat", path, "--separator", r"\x1e--").stdout
    assert out == b"".join(r + b"\x1e--" for r in FLOATS)


def test_cat_text_formats_keep_their_newline(tmp_path):
    path = write(tmp_path / "f.array_record", [b"a", b"bc"])
    assert run("cat", path, "--format", "hex").stdout == b"61\n6263\n"
    assert run("cat", path, "--format", "hex", "--separator", r"\0").stdout == b"61\x006263\x00"
    assert run("cat", path, "--format", "json").stdout.count(b"\n") == 2


def test_a_bad_separator_is_refused(tmp_path):
    path = write(tmp_path / "f.array_record", [b"a"])
    proc = run("cat", path, "--separator", r"\q", ok=False)
    assert b"--separator" in proc.stderr and b"Traceback" not in proc.stderr


# -- cat --format npy: what convert reads ----------------------------------------------


def test_cat_npy_gives_back_the_array_convert_read(tmp_path):
    arr = np.arange(60, dtype=np.float32).reshape(10, 2, 3)
    np.save(tmp_path / "in.npy", arr)
    run("convert", str(tmp_path / "in.npy"), str(tmp_path / "out"), "-q")
    [converted] = tmp_path.glob("out-*.array_record")
    back = np.load(io.BytesIO(run("cat", str(converted), "--format", "npy").stdout))
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    part = np.load(io.BytesIO(run("cat", str(converted), "--format", "npy",
                                  "--range=-3:").stdout))
    np.testing.assert_array_equal(part, arr[-3:])
    # ... and convert reads what cat wrote: the same records
    (tmp_path / "again.npy").write_bytes(run("cat", str(converted), "--format", "npy").stdout)
    run("convert", str(tmp_path / "again.npy"), str(tmp_path / "again"), "-q")
    [again] = tmp_path.glob("again-*.array_record")
    assert run("cat", str(again), "--format", "hex").stdout == \
        run("cat", str(converted), "--format", "hex").stdout


def test_cat_npy_of_untyped_records_of_one_length_is_a_byte_matrix(tmp_path):
    path = write(tmp_path / "f.array_record", FLOATS)
    back = np.load(io.BytesIO(run("cat", path, "--format", "npy").stdout))
    assert back.dtype == np.uint8 and back.shape == (5, 12)
    assert [row.tobytes() for row in back] == FLOATS


def test_cat_npy_refuses_records_of_different_lengths_before_writing(tmp_path):
    path = write(tmp_path / "f.array_record", [b"abc", b"abc", b"abcd"])
    proc = run("cat", path, "--format", "npy", ok=False)
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert "different lengths" in err and "record 2" in err and "Traceback" not in err
    assert run("cat", path, "--format", "npy", "--range", ":2").stdout.startswith(b"\x93NUMPY")
    proc = run("cat", path, "--format", "npy", "--separator", r"\n", ok=False)
    assert b"--separator" in proc.stderr


def test_cat_npy_refuses_named_fields_and_files_that_disagree(tmp_path):
    from aioloader import ElementSpec

    spec = ElementSpec.of({"label": ("int64", ()), "emb": ("float32", (2,))})
    with aioloader.ArrayRecordWriter(tmp_path / "named.array_record", element_spec=spec) as w:
        w.write(spec.encode({"label": np.int64(1), "emb": np.zeros(2, np.float32)}))
    proc = run("cat", str(tmp_path / "named.array_record"), "--format", "npy", ok=False)
    assert b"named fields" in proc.stderr and proc.stdout == b""
    typed = ElementSpec.array("float32", (3,))
    with aioloader.ArrayRecordWriter(tmp_path / "m-0.array_record", element_spec=typed) as w:
        w.write(FLOATS[0])
    write(tmp_path / "m-1.array_record", [FLOATS[1]])
    proc = run("cat", str(tmp_path / "m-*.array_record"), "--format", "npy", ok=False)
    assert b"m-1.array_record" in proc.stderr and b"Traceback" not in proc.stderr


# -- --range with a negative start -----------------------------------------------------


def test_a_negative_range_needs_no_equals_sign(tmp_path):
    path = write(tmp_path / "f.array_record", [b"a", b"b", b"c", b"d"])
    assert run("cat", path, "--range", "-2:", "--format", "hex").stdout == b"63\n64\n"
    assert run("cat", path, "--range", "-3:-1", "--format", "hex").stdout == b"62\n63\n"
    assert run("cat", path, "--range", "1:-2", "--format", "hex").stdout == b"62\n"


# -- progress bars only on a terminal; no error after a bar ------------------------------


def _jsonl(tmp_path, n: int = 3000) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(n)))
    return str(path)


def test_no_progress_bar_into_a_log(tmp_path):
    src = _jsonl(tmp_path)
    proc = run("convert", src, str(tmp_path / "out"))
    assert b"\r" not in proc.stderr and b"converting" not in proc.stderr
    proc = run("convert", src, str(tmp_path / "out"), ok=False)  # it exists now
    assert proc.stderr.decode().startswith("aioloader convert: output already exists")
    assert proc.stderr.count(b"\n") == 1, proc.stderr.decode()


def _on_a_terminal(*args: str) -> tuple[int, bytes]:
    """Run the command with a pseudo-terminal as its stderr; (exit code, what it showed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 cols
    proc = subprocess.Popen([sys.executable, "-m", "aioloader.tools.cli", *args],
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    shown = b""
    while True:
        try:
            data = os.read(leader, 1 << 16)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        shown += data
    os.close(leader)
    return proc.wait(timeout=60), shown


def test_on_a_terminal_the_bar_shows_and_an_error_stands_alone(tmp_path):
    src = _jsonl(tmp_path)
    code, shown = _on_a_terminal("convert", src, str(tmp_path / "out"))
    assert code == 0 and b"converting" in shown
    code, shown = _on_a_terminal("convert", src, str(tmp_path / "out"))
    assert code == 1 and b"converting" not in shown, shown
    assert shown.lstrip().startswith(b"aioloader convert: output already exists")


# -- storage options ---------------------------------------------------------------------


@pytest.fixture
def bucket(tmp_path):
    """A local bucket with one file, and an environment that does not point at it: only
    storage options (its endpoint, an anonymous token) reach it."""
    from aioloader.testing import local_gcs

    with local_gcs() as gcs:
        url = gcs.upload(write(tmp_path / "f.array_record", FLOATS), "d/f.array_record")
        env = {k: v for k, v in os.environ.items()
               if k not in ("STORAGE_EMULATOR_HOST", "CLOUD_STORAGE_EMULATOR_ENDPOINT")}
        options = ["--storage-option", "token=anon",
                   "--storage-option", f"endpoint_url={gcs.endpoint}"]
        yield gcs, url, env, options


def test_storage_options_reach_the_bucket(bucket, tmp_path):
    gcs, url, env, options = bucket
    info = json.loads(run("inspect", "--json", url, *options, env=env).stdout)
    assert info["records"] == len(FLOATS)
    assert run("cat", url, *options, env=env).stdout == b"".join(FLOATS)
    (tmp_path / "so.json").write_text(json.dumps(gcs.storage_options))
    assert run("cat", url, "--storage-options", str(tmp_path / "so.json"),
               env=env).stdout == b"".join(FLOATS)
    out = run("bench", url, "--pipeline", "raw", "--workers", "0", "-q", *options,
              env=env).stdout.decode()
    assert f"{len(FLOATS)} records" in out
    run("convert", _jsonl(tmp_path, 10), gcs.url("conv/out"), "-q", *options, env=env)
    assert "conv/out-00000-of-00001.array_record" in gcs.list_objects("conv/")


def test_a_storage_options_value_is_never_printed(bucket, tmp_path):
    _, url, env, options = bucket
    secret = "s3cr3t-t0ken-value"
    for extra in (["--storage-option", f"token={secret}"], ["--storage-option", secret]):
        proc = run("cat", url, *options, *extra, env=env, ok=False)
        assert secret.encode() not in proc.stderr + proc.stdout, proc.stderr.decode()
    proc = run("inspect", url, *options, "--storage-option", f"token={secret}",
               env=env, ok=False)
    assert secret.encode() not in proc.stderr
    (tmp_path / "bad.json").write_text('{"token": "' + secret + '",')  # not JSON
    proc = run("cat", url, "--storage-options", str(tmp_path / "bad.json"), ok=False)
    assert b"bad.json" in proc.stderr and secret.encode() not in proc.stderr


def test_storage_option_values_are_json_or_text_and_errors_show_keys_only():
    import argparse

    from aioloader.tools.cli_common import scrub, storage_options

    args = argparse.Namespace(storage_options_file=None, storage_option=[
        "token=anon", "requester_pays=true", "timeout=30", 'project="123"', "x=a=b"])
    assert storage_options(args) == {"token": "anon", "requester_pays": True, "timeout": 30,
                                     "project": "123", "x": "a=b"}
    options = {"token": {"refresh_token": "s3cr3t"}, "key": "k3y-value"}
    shown = scrub("bad token s3cr3t, key k3y-value", options)
    assert shown == "bad token <token>, key <key>"


# -- bench: what each figure counts ------------------------------------------------------


def test_bench_says_what_its_figures_count(tmp_path):
    path = write(tmp_path / "f.array_record", [bytes(1000)] * 2000, group_size=1)
    out = run("bench", path, "--pipeline", "raw", "--workers", "0", "--batch", "100",
              "-q").stdout.decode()
    read = re.search(r"read\s+([\d.,]+) ([kMG]B)/s", out)
    assert read and float(read.group(1).replace(",", "")) > 0, out
    first = next(line for line in out.splitlines() if line.startswith("time to first batch"))
    assert "opening" in first, out  # what it counts
    assert "consumer waited" in out.split("pipeline:")[0], out  # and how it meets the table's


def test_bench_writes_the_report_it_was_asked_for_and_refuses_a_folder(tmp_path):
    from tests.support.report_page import read

    path = write(tmp_path / "f.array_record", [bytes(100)] * 400, group_size=8)
    report = tmp_path / "report.html"
    out = run("bench", path, "--pipeline", "raw", "--workers", "0", "--batch", "20", "-q",
              "--report", str(report)).stdout.decode()
    assert f"report: {report}" in out, out
    data = read(str(report)).data
    assert data["summary"]["batches"] == 20 and data["summary"]["records"] == 400
    assert data["table"].splitlines()[0] in out  # the table it printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.array_record", "report.html"]
    # a folder is refused before the run, saying what to name
    proc = run("bench", path, "--pipeline", "raw", "--workers", "0", "-q", "--report",
               str(tmp_path), ok=False)
    assert proc.returncode == 1 and b"is a folder" in proc.stderr and not proc.stdout


# -- --version -----------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["cat", "--help"]])
def test_version_and_help_load_none_of_the_runtime(args):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "aioloader.tools.cli",
                           *args], capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(b"aioloader " if args == [
        "--version"] else b"usage: aioloader")
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines()}
    heavy = {m for m in loaded if m.split(".")[0] in ("numpy", "fsspec", "tqdm")
             or m.startswith(("aioloader.io", "aioloader.runtime", "aioloader.source"))}
    assert not heavy, sorted(heavy)


def test_the_parser_offers_the_pipelines_bench_has():
    from aioloader.tools import cli, cli_bench

    assert tuple(sorted(cli._PIPELINES)) == cli_bench.PIPELINES


def test_version_without_installed_metadata(monkeypatch, capsys):
    import importlib.metadata

    from aioloader.tools import cli

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out == f"aioloader {aioloader.__version__}\n"


@given(st.text(min_size=3), st.sampled_from(["{}", "access_token={}&x=1", "'{}'", "\"{}\""]))
def test_scrub_hides_a_value_however_a_url_quotes_it(value, where):
    """An error may quote a storage option's value as given, as JSON, or percent-encoded (a
    token in a URL's query: `+`, `/`, `=` become %2B, %2F, %3D): none of them is shown."""
    from urllib.parse import quote, quote_plus

    for shown in {value, json.dumps(value), quote(value, safe=""), quote_plus(value)}:
        text = scrub("failed: " + where.format(shown), {"token": value})
        assert shown not in text and "<token>" in text
