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


@pytest.fixture(scope="module")
def gcs():
    with local_gcs() as bucket:
        with aioloader.ArrayRecordWriter(f"gs://{bucket.bucket}/u/part-0.array_record") as w:
            for i in range(100):
                w.write(f"r{i}".encode())
        yield bucket


@pytest.mark.allow_leaks  # gcsfs's sync filesystem (the writer's upload) keeps its connection
@pytest.mark.parametrize("client", ["curl", "aiohttp"])
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_unclosed_session_at_exit(gcs, client, name):
    code = (f"import aioloader\nURL = 'gs://{gcs.bucket}/u/part-0.array_record'\n"
            + SCRIPTS[name])
    env = {**os.environ, "AIOLOADER_GCS_CLIENT": client, "PYTHONWARNINGS": "default"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    if "raise" in name:
        assert proc.returncode == 1 and "the training step failed" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
    assert "Unclosed" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
