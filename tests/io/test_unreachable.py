"""gs:// that cannot be reached (no such host, nothing listening, no credentials) fails within
a few seconds with one error naming the URL and the cause, not after the clients' retries."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from aioloader.io import reach
from aioloader.io.gcs.store import gcs_auth_hint, gcs_failure, gcs_options
from aioloader.io.storage import RetryPolicy, StoreUnavailableError
from aioloader.source import ArrayRecordSource


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENDPOINTS = {
    "refused": (lambda: f"http://127.0.0.1:{_closed_port()}", "refused"),
    "no such host": (lambda: "http://no-such-host.invalid:4443", "no-such-host.invalid"),
}


@pytest.mark.parametrize("client", ["curl", "fsspec"])
@pytest.mark.parametrize("kind", sorted(ENDPOINTS))
@pytest.mark.parametrize("url", ["gs://bkt/train-0.array_record", "gs://bkt/train-*"])
def test_an_unreachable_store_fails_fast_naming_the_url_and_cause(monkeypatch, caplog, client,
                                                                  kind, url):
    make, cause = ENDPOINTS[kind]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", make())
    monkeypatch.setenv("AIOLOADER_GCS_CLIENT", client)
    import gcsfs  # noqa: F401  (imported outside the timing: ~1-4 s on a loaded machine)

    async def main() -> float:
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            await ArrayRecordSource.open(url)
        took = time.monotonic() - t0
        text = str(info.value)
        assert url in text and cause in text.replace("could not connect", "refused"), text
        return took

    with caplog.at_level(logging.WARNING):
        took = asyncio.run(main())
    # told by the probe, not by retries running into the read deadline (10 s) or gcsfs's own
    # ~30 s of DNS retries: half the deadline leaves a loaded machine room
    assert took < RetryPolicy().deadline / 2, took
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # no gcsfs noise


def test_the_cli_prints_one_line():
    env = {**os.environ, "STORAGE_EMULATOR_HOST": "http://no-such-host.invalid:4443"}
    proc = subprocess.run([sys.executable, "-m", "aioloader.tools.cli", "inspect", "gs://bkt/x-*"],
                          capture_output=True, timeout=120, env=env, text=True)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gs://bkt/x-*" in lines[0] and "resolve" in lines[0], lines


def test_no_credentials_anywhere_goes_anonymous_at_once_and_says_so(monkeypatch, tmp_path):
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "CLOUDSDK_CONFIG",
                "GCE_METADATA_HOST", "GCE_METADATA_IP", "K_SERVICE", "CLOUD_RUN_JOB",
                "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(reach, "_on_google_machine", lambda: False)
    assert not reach.gcs_credentials_found({})
    assert gcs_options({})["token"] == "anon"
    err = gcs_failure("gs://b/x", 401, "Anonymous caller", None, gcs_auth_hint({}))
    assert isinstance(err, PermissionError) and "no Google Cloud credentials" in str(err)
    # Any sign of credentials leaves the search to gcsfs.
    adc = tmp_path / ".config" / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    adc.write_text("{}")
    assert reach.gcs_credentials_found({}) and "token" not in gcs_options({})
    assert gcs_auth_hint({}) == ""
    adc.unlink()
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    assert "token" not in gcs_options({})
    assert gcs_options({"token": "x"})["token"] == "x"


def test_the_probe_is_silent_when_the_store_answers():
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            assert await reach.probe(f"http://127.0.0.1:{port}") is None
            assert "refused" in await reach.probe(f"http://127.0.0.1:{_closed_port()}")
            assert await reach.guarded("gs://b/x", f"http://127.0.0.1:{port}",
                                       asyncio.sleep(0.01, "ok")) == "ok"

    asyncio.run(main())
