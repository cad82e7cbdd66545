"""A server that ignores `Range` (answers 200 with the whole object) is named as such: the
error says the server ignored the byte range, not that the file shrank. Served by a real
HTTP server on 127.0.0.1 (Python's own, which ignores Range), read through an http:// URL."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading

import pytest

import aioloader as al
from aioloader.errors import StorageError

from ..support.arrayrecord_util import make_records, write_theirs


@contextlib.contextmanager
def _whole_object_server(root):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="ignores-range")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_server_that_ignores_range_is_named(tmp_path):
    write_theirs(tmp_path / "a.ar", make_records(100, 2000, seed=3), "group_size:1")
    with _whole_object_server(tmp_path) as base:
        src = al.ArrayRecordSource(f"{base}/a.ar")
        with pytest.raises(StorageError) as err:
            len(src)
    message = str(err.value)
    assert "the server ignored the byte range" in message and "a.ar" in message
    assert "shorter than when it was opened" not in message
