"""storage_options reach every request: the writer's uploads, and gs:// range reads (which build
their own URLs: gcsfs's `url()` leaves out the `userProject` that requester_pays needs).

Checked over real HTTP: a small recording proxy sits between the clients and fake-gcs-server
and keeps the request line of every request it forwards.
"""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qs, urlsplit

import pytest

import aioloader
from aioloader.testing import local_gcs

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@contextmanager
def recorder(upstream: str) -> Iterator[tuple[str, list[str]]]:
    """An HTTP/1.0 proxy to `upstream`: (its endpoint, the request lines it forwarded)."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            seen.append(f"{self.command} {self.path}")
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                         headers=headers)
            try:
                resp = urllib.request.urlopen(req, timeout=30)
            except urllib.error.HTTPError as err:
                resp = err
            with resp:
                data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")  # no client keeps a socket to us
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def gcs():
    with local_gcs() as bucket:
        yield bucket


def _user_projects(lines: list[str], method: str, part: str) -> list[list[str]]:
    return [parse_qs(urlsplit(line.split(" ", 1)[1]).query).get("userProject", [])
            for line in lines if line.startswith(method) and part in line]


# gcsfs's sync filesystem (fsspec's cached instance, which the writer's upload uses) keeps its
# keep-alive connection to the emulator open: as with any gs:// write, before this change too.
@pytest.mark.allow_leaks
@pytest.mark.parametrize("client", ["auto", "fsspec"])
def test_requester_pays_reaches_writes_listings_and_range_reads(gcs, client, monkeypatch):
    monkeypatch.setenv("AIOLOADER_GCS_CLIENT", client)
    records = [f"record {i}".encode() for i in range(50)]
    with recorder(gcs.server_endpoint) as (endpoint, seen):
        opts = {**gcs.storage_options, "endpoint_url": endpoint, "requester_pays": "payer-1"}
        url = f"gs://{gcs.bucket}/rp-{client}/part-0.array_record"
        with aioloader.ArrayRecordWriter(url, group_size=4, storage_options=opts) as w:
            for r in records:
                w.write(r)
        uploads = _user_projects(seen, "POST", "/upload/")
        assert uploads and all(u == ["payer-1"] for u in uploads), seen
        seen.clear()
        with aioloader.ArrayRecordSource(f"gs://{gcs.bucket}/rp-{client}/part-*",
                                         storage_options=opts) as src:
            assert src[list(range(50))] == records
        downloads = _user_projects(seen, "GET", "alt=media")
        assert downloads and all(u == ["payer-1"] for u in downloads), seen
        listings = _user_projects(seen, "GET", "/o?")
        assert listings and all(u == ["payer-1"] for u in listings), seen


def test_the_writer_refuses_storage_options_for_a_file_object(tmp_path):
    with open(tmp_path / "x", "wb") as f, pytest.raises(ValueError, match="storage_options"):
        aioloader.ArrayRecordWriter(f, storage_options={"token": "anon"})
