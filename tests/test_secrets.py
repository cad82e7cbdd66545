"""Credentials never leak: not in a repr, a log, an error, the stats, the state or a checkpoint.

A token, a refresh token, a client secret, an Authorization header, a signed URL's signature
and a `user:password@` URL go through every surface that prints or stores something — the
pipeline runs for real against the local GCS emulator over HTTP (signed and `user:pass@` URLs
through fsspec's HTTP filesystem, the token through gcsfs), failures are real 403/404 answers
— and none of the secret strings may appear anywhere.
"""

from __future__ import annotations

import traceback

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioloader.storage import has_glob, redact

TOKEN = "ya29.SEKRIT-access-token-1111"
REFRESH = "1//SEKRIT-refresh-token-2222"
CLIENT_SECRET = "SEKRIT-client-secret-3333"
HEADER = "Bearer SEKRIT-header-4444"
SIGNATURE = "5555SEKRITsignature0a1b2c3d4e5f"
PASSWORD = "SEKRIT-password-6666"
SAS = "SEKRIT-sas-7777"
SECRETS = [TOKEN, REFRESH, CLIENT_SECRET, HEADER, SIGNATURE, PASSWORD, SAS,
           "SEKRIT-header-4444"]

# fsspec's HTTP filesystem sends these with every request; an Authorization header would clash
# with a URL's user:password (aiohttp refuses both), so it goes to gcsfs's session below.
HTTP_OPTIONS = {"headers": {"X-Api-Key": HEADER}}
N = 60  # records per file; two files, batch 1: 120 batches (the debug log comes every 100)


def assert_clean(text: str, where: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"{where} shows {leaked}:\n{text}"


def assert_error_clean(exc: BaseException, where: str) -> None:
    """The message, the repr and the whole printed traceback (chained causes too)."""
    assert_clean(str(exc), where)
    assert_clean(repr(exc), where)
    assert_clean("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), where)


def signed(base: str, name: str) -> str:
    """A V4-signed URL for object `name` (the emulator ignores the signature)."""
    return (f"{base}/{name}?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p.iam."
            "gserviceaccount.com%2F20260101%2Fauto%2Fstorage%2Fgoog4_request&X-Goog-Date="
            f"20260101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature="
            f"{SIGNATURE}")


def with_password(base: str, name: str) -> str:
    scheme, _, rest = base.partition("://")
    return f"{scheme}://reader:{PASSWORD}@{rest}/{name}"


# -- redact and has_glob, the pure helpers ------------------------------------------------------

@pytest.mark.parametrize("url", [
    f"https://storage.googleapis.com/b/x.ar?X-Goog-Signature={SIGNATURE}&X-Goog-Date=1",
    f"https://b.s3.amazonaws.com/x.ar?X-Amz-Credential=AK&X-Amz-Signature={SIGNATURE}",
    f"https://acct.blob.core.windows.net/c/x.ar?sv=2022&sig={SAS}&se=2030",
    f"https://host/x.ar?token={TOKEN}",
    f"https://host/x.ar?a=1&access_token={TOKEN}#frag",
    f"https://host/x.ar#access_token={TOKEN}",
    f"https://host?token={TOKEN}",
    f"https://host/x.ar?{TOKEN}",
    f"https://reader:{PASSWORD}@host/x.ar",
    f"https://reader:{PASSWORD}@host:8443/x.ar?sig={SAS}",
    f"https://{TOKEN}@host/x.ar",
    f"gs://reader:{PASSWORD}@bucket/x.ar",
    f"simplecache::https://reader:{PASSWORD}@host/x.ar?sig={SAS}",
    f"zip://inner.ar::s3://k:{PASSWORD}@bucket/x.zip",
    f"s3://bucket/x.ar?versionId=1&X-Amz-Signature={SIGNATURE}",
    f"HTTPS://HOST/x.ar?Signature={SIGNATURE}",
])
def test_redact_hides_userinfo_and_every_query_value(url):
    out = redact(url)
    assert_clean(out, "redact()")
    assert "://" in out
    assert redact(out) == out  # idempotent: a redacted URL stays as it is


def test_redact_keeps_what_is_no_secret():
    sig = "https://h/b/x.ar?X-Goog-Date=1&X-Goog-Signature=abc"
    assert redact(sig) == "https://h/b/x.ar?X-Goog-Date=***&X-Goog-Signature=***"
    assert redact("https://u:p@h:1/x.ar") == "https://***@h:1/x.ar"
    for kept in ["/data/train-?.ar", "/data/a b?x=1#y.ar", "relative/x.ar", "gs://b/x-?.ar",
                 "gs://b/dt=2024/*.ar", "file:///data/x?.ar", "gs://b/x.ar#1712345", ""]:
        assert redact(kept) == kept


def test_redact_finds_urls_inside_messages():
    msg = (f"403, message='Forbidden', url=URL('https://h/x.ar?X-Goog-Signature={SIGNATURE}'); "
           f"also (https://u:{PASSWORD}@h/y.ar), no such file /tmp/x?y.ar")
    out = redact(msg)
    assert_clean(out, "redact(message)")
    assert out.endswith("(https://***@h/y.ar), no such file /tmp/x?y.ar")
    assert "url=URL('https://h/x.ar?X-Goog-Signature=***')" in out


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1),
       st.sampled_from(["http", "https", "gs", "s3", "az"]))
def test_redact_property_no_query_value_or_password_survives(value, scheme):
    secret = "SEKRIT" + value.replace("&", "").replace("#", "").replace("/", "")
    for url in (f"{scheme}://host/x.ar?k=1&sig={secret}",
                f"{scheme}://u:{secret}@host/x.ar"):
        if any(c.isspace() or c in "'\"<>" for c in secret):
            continue  # not part of a URL: a message would end the URL there
        assert secret not in redact(url), url


@given(st.text(alphabet="abc/._-?*[]=& ", max_size=30))
def test_redact_leaves_local_paths_alone(path):
    assert redact(path) == path


def test_has_glob_a_query_is_not_a_glob():
    assert has_glob("gs://b/x?.ar")
    assert has_glob("gs://b/train-*.ar")
    assert has_glob("/data/x-[0-3].ar")
    assert has_glob("/data/x?.ar")
    assert has_glob("https://h/b/train-*.ar?X-Goog-Signature=abc")
    assert not has_glob(f"https://h/b/x.ar?X-Goog-Signature={SIGNATURE}&X-Goog-Date=1")
    assert not has_glob("http://h/b/x.ar?a=b?c")
    assert not has_glob("https://h/x.ar#frag?")
    assert not has_glob("s3://b/x.ar?versionId=abc")
    assert not has_glob("gs://b/x.ar")
