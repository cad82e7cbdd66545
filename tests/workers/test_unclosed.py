"""Sessions are always closed: a script that never closes its source, or that ends on an
exception escaping a `next()`-driven loop, prints no "Unclosed client session / connector"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import aioloader
from aioloader.testing import local_gcs

SCRIPTS = {
    # A source used through the sync API, still referenced at exit (a glob: gcsfs's session
    # lists it, whichever client reads).
    "source kept": ("src = aioloader.ArrayRecordSource(URL.replace('-0.', '-*.'))\n"
                    "assert len(src[0:50]) == 50\n"),
    # A source dropped without close (collected before exit).
    "source dropped": textwrap.dedent("""
        def peek():
            src = aioloader.ArrayRecordSource(URL)
            return src[3]
        assert peek() == b"r3"
        import gc; gc.collect()
    """),
    # An exception escapes a next()-driven loop; nothing is closed by the script.
    "next() then raise": textwrap.dedent("""
        it = iter(aioloader.Dataset.from_arrayrecord(URL).batch(4).loader(workers=0))
        for step in range(3):
            next(it)
        raise RuntimeError("the training step failed")
    """),
}


def _runs_clean(code: str, env: dict, name: str) -> None:
    """Run `code` in a fresh interpreter: it ends as the script meant, and nothing is
    reported unclosed or ignored at exit."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    if "raise" in name:
        assert proc.returncode == 1 and "the training step failed" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
    assert "Unclosed" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def gcs():
    with local_gcs() as bucket:
        with aioloader.ArrayRecordWriter(f"gs://{bucket.bucket}/u/part-0.array_record") as w:
            for i in range(100):
                w.write(f"r{i}".encode())
        yield bucket


@pytest.mark.allow_leaks  # gcsfs's sync filesystem (the writer's upload) keeps its connection
@pytest.mark.parametrize("client", ["curl", "fsspec"])
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_unclosed_session_at_exit(gcs, client, name):
    code = (f"import aioloader\nURL = 'gs://{gcs.bucket}/u/part-0.array_record'\n"
            + SCRIPTS[name])
    env = {**os.environ, "AIOLOADER_GCS_CLIENT": client, "PYTHONWARNINGS": "default"}
    _runs_clean(code, env, name)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3 API over HTTP: moto's server in its own process (the s3:// path is fsspec's
    s3fs, which holds an aiobotocore session of its own)."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    import socket

    import s3fs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "test", "secret": "test",
               "client_kwargs": {"region_name": "eu-west-1"}}
    try:
        import time
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("moto's S3 server did not start")
                time.sleep(0.1)
        local = tmp_path_factory.mktemp("s3") / "part-0.array_record"
        with aioloader.ArrayRecordWriter(local) as w:
            for i in range(100):
                w.write(f"r{i}".encode())
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("bucket")
        fs.put(str(local), "bucket/u/part-0.array_record")
        yield options
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_unclosed_session_at_exit_s3(s3, name):
    """Issue 17 item 13: after s3:// runs (s3fs's aiobotocore session), nothing is reported
    unclosed at exit either."""
    script = SCRIPTS[name]
    for call in ("(URL.replace('-0.', '-*.'))", "(URL)"):
        script = script.replace(call, call[:-1] + ", storage_options=OPTS)")
    assert "OPTS" in script
    code = (f"import aioloader\nURL = 's3://bucket/u/part-0.array_record'\nOPTS = {s3!r}\n"
            + script)
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    _runs_clean(code, env, name)
