"""Credentials never leak: not in a repr, a log, an error, the stats, the state or a checkpoint.

A token, a refresh token, a client secret, an Authorization header, a signed URL's signature
and a `user:password@` URL go through every surface that prints or stores something — the
pipeline runs for real against the local GCS emulator over HTTP (signed and `user:pass@` URLs
through fsspec's HTTP filesystem, the token through gcsfs), failures are real 403/404 answers
— and none of the secret strings may appear anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback

import fsspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.io.gate import Gate
from aioloader.io.storage import Storage, has_glob, redact
from aioloader.testing import local_gcs

from .support import pipeline_fns as fns

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
# with a URL's user:password (fsspec's client refuses both), so it goes to gcsfs's session below.
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


@given(st.text(alphabet="ab:/._-*[]=&;%+ \"'()<>", max_size=40),
       st.sampled_from(["http", "https", "gs", "s3", "simplecache::gs"]))
def test_redact_of_urls_without_userinfo_or_query_is_the_text_itself(text, scheme):
    """`redact` returns such text at once (opening 2,000 files redacts each URL): the general
    path, which it skips, would change nothing either."""
    from aioloader import urls

    text = f"{scheme}://{text}"
    whole = urls._WHOLE_URL.fullmatch(text)
    general = (urls._redact_url(text) if whole else
               urls._URL_IN_TEXT.sub(lambda m: urls._redact_url(m.group()), text))
    assert redact(text) == text == general


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


# -- what a pipeline prints before it runs ------------------------------------------------------

LEAKY_OPTIONS = {
    "token": {"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
              "client_secret": CLIENT_SECRET, "refresh_token": REFRESH, "access_token": TOKEN},
    "headers": {"Authorization": HEADER},
    "session_kwargs": {"headers": {"Authorization": HEADER}},
}


def test_descriptions_show_option_keys_never_values():
    paths = [signed("https://storage.googleapis.com/b", "x.ar"),
             with_password("https://h", "y.ar")]
    ds = (al.Dataset.from_arrayrecord(paths, storage_options=LEAKY_OPTIONS)
          .shuffle(1).map(fns.decode).batch(2))
    for where, text in [("repr(Dataset)", repr(ds)), ("str(Dataset)", str(ds)),
                        ("describe()", "\n".join(ds.describe())),
                        ("repr(SourceSpec)", repr(ds.source)),
                        ("repr(ds.map(...))", repr(ds.map(fns.just_id)))]:
        assert_clean(text, where)
    assert "token" in repr(ds) and "headers" in repr(ds)  # the keys are shown
    for path in paths:
        src = al.ArrayRecordSource(path, storage_options=LEAKY_OPTIONS)
        assert_clean(repr(src), "repr(ArrayRecordSource)")
        assert_clean(str(src), "str(ArrayRecordSource)")
        assert_clean(repr(al.Dataset.from_arrayrecord(path, storage_options=LEAKY_OPTIONS)),
                     "repr(Dataset.from_arrayrecord)")
    loader = ds.loader()
    for where, text in [("repr(Loader)", repr(loader)), ("stats()", str(loader.stats())),
                        ("stats().as_dict()", json.dumps(loader.stats().as_dict()))]:
        assert_clean(text, where)
    loader.close()


# -- a real pipeline over HTTP, and every surface it has ----------------------------------------

@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    with local_gcs(proxy=True) as bucket:
        for name, first in [("a.ar", 0), ("b.ar", N)]:
            path = root / name
            with al.ArrayRecordWriter(str(path), options="group_size:1") as w:
                for i in range(first, first + N):
                    w.write(json.dumps({"id": i, "tokens": [i]}).encode())
            bucket.upload(path, name)
        yield bucket


@pytest.fixture
def no_faults(gcs):
    yield gcs
    gcs.set_faults(error_rate=0.0)


def _pipeline(paths, options):
    return (al.Dataset.from_arrayrecord(paths, storage_options=options)
            .shuffle(7).map(fns.decode).map(fns.only_id_noise_det).batch(1))


def _report(loader, tmp_path) -> str:
    with open(loader.stats().report(tmp_path / "report.html"), encoding="utf-8") as f:
        return f.read()


def _every_surface(ds, tmp_path, monkeypatch, caplog) -> list[int]:
    """Run `ds` to the end with debug logging on, checking every surface; save it half way
    with Orbax, and resume from that checkpoint. Returns the ids seen."""
    ocp = pytest.importorskip("orbax.checkpoint")
    from aioloader.jax import LoaderRestore, LoaderSave

    monkeypatch.setenv("AIOLOADER_DEBUG", "1")
    caplog.set_level(logging.DEBUG)
    loader = ds.loader(workers=0)
    it = loader.to_jax()
    assert_clean(repr(loader), "repr(Loader)")
    assert_clean(repr(it), "repr(DeviceIterator)")
    ids = [int(np.asarray(next(it)["id"])[0]) for _ in range(N)]
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(N, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": np.ones(2)}),
                                             data=LoaderSave(it)))
        mngr.wait_until_finished()
    state = it.get_state()
    ids += [int(np.asarray(b["id"])[0]) for b in it]
    assert sorted(ids) == list(range(2 * N))
    for where, text in [
        ("repr(Loader)", repr(loader)), ("repr(iterator)", repr(it)),
        ("stats()", str(loader.stats())),
        ("stats().as_dict()", json.dumps(loader.stats().as_dict(), default=str)),
        ("stats().report()", _report(loader, tmp_path)),
        ("get_state()", json.dumps(state)), ("get_state()", json.dumps(loader.get_state())),
        ("the log", caplog.text),
        ("the log (raw records)", "\n".join(f"{r.name} {r.msg} {r.args}"
                                            for r in caplog.records)),
    ]:
        assert_clean(text, where)
    assert "aioloader stats" in caplog.text  # AIOLOADER_DEBUG did log
    it.close()
    files = [p for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]
    assert any(p.name.endswith(".json") and p.name.startswith("process_") for p in files)
    for p in files:
        assert_clean(p.read_bytes().decode("latin-1"), f"checkpoint file {p.name}")
    # The checkpoint resumes the same pipeline where it stopped.
    fresh = ds.loader(workers=0)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.restore(N, args=ocp.args.Composite(state=ocp.args.StandardRestore({"w": np.ones(2)}),
                                                data=LoaderRestore(fresh)))
    rest = [int(np.asarray(b["id"])[0]) for b in fresh]
    assert ids[:N] + rest == ids
    return ids


def test_signed_and_password_urls_never_show(gcs, tmp_path, monkeypatch, caplog):
    base = f"{gcs.server_endpoint}/{gcs.bucket}"
    paths = [signed(base, "a.ar"), with_password(base, "b.ar")]
    ds = _pipeline(paths, HTTP_OPTIONS)
    _every_surface(ds, tmp_path, monkeypatch, caplog)
    src = al.ArrayRecordSource(paths, storage_options=HTTP_OPTIONS)
    try:
        assert len(src) == 2 * N
        assert_clean(repr(src), "repr(ArrayRecordSource)")
    finally:
        src.close()


def test_token_options_never_show(gcs, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")  # a raw token: no call to Google
    options = {"token": TOKEN, "endpoint_url": gcs.endpoint,
               "session_kwargs": {"headers": {"Authorization": HEADER}},
               "refresh_token": REFRESH, "client_secret": CLIENT_SECRET}
    ds = _pipeline([gcs.url("a.ar"), gcs.url("b.ar")], options)
    assert_clean(repr(ds), "repr(Dataset)")
    _every_surface(ds, tmp_path, monkeypatch, caplog)


def test_retries_and_hedges_log_no_secret(gcs, monkeypatch, caplog):
    """Under injected 503/429s and held answers through the delay line, every retried attempt
    and every hedge is logged at DEBUG, naming the URL, the range and the cause
    (`aioloader.retry`), as are the rate-limited warnings: none of it shows a token, a header
    or a client secret."""
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")  # a raw token: no call to Google
    caplog.set_level(logging.DEBUG)
    token = {"token": TOKEN, "endpoint_url": gcs.endpoint,
             "session_kwargs": {"headers": {"Authorization": HEADER}},
             "refresh_token": REFRESH, "client_secret": CLIENT_SECRET}
    policy = al.RetryPolicy(attempts=30, base_delay=0.001, max_delay=0.01, hedge_after=0.05,
                            hedge_budget=1.0)
    gcs.set_faults(error_rate=0.3, statuses=(503, 429), hold_rate=0.05, hold_s=0.3)
    try:
        ds = _pipeline([gcs.url("a.ar"), gcs.url("b.ar")], token)
        ids = [int(b["id"][0]) for b in ds.loader(retry=policy, resident_bytes=0, max_gap=0)]
    finally:
        gcs.set_faults()
    assert sorted(ids) == list(range(2 * N))
    lines = [r.getMessage() for r in caplog.records if r.name == "aioloader.retry"]
    assert any("retrying" in m and "HTTP 503" in m for m in lines), lines
    assert_clean(caplog.text, "the log")
    assert_clean("\n".join(f"{r.name} {r.msg} {r.args}" for r in caplog.records),
                 "the log (raw records)")


async def test_retry_lines_redact_signed_and_password_urls(caplog):
    """The retry's own lines name the URL as `redact` shows it (the fault injector cannot
    serve signed http URLs: the emulator answers them only on its own host)."""
    from aioloader.errors import Transient
    from aioloader.io.retry import Retrier

    caplog.set_level(logging.DEBUG, logger="aioloader")
    failures = iter([Transient("HTTP 503"), Transient("HTTP 429")])

    async def call():
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return b"ok"

    retrier = Retrier(al.RetryPolicy(base_delay=0.001), Storage().stats, __import__("random")
                      .Random(0))
    for url in [signed("https://h/b", "a.ar"), with_password("https://h/b", "b.ar")]:
        failures = iter([Transient("HTTP 503"), Transient("HTTP 429")])
        assert await retrier.run(Gate(1), call, (), streams=False, url=url,
                                 span=(0, 10)) == b"ok"
    lines = [r.getMessage() for r in caplog.records if r.name == "aioloader.retry"]
    assert len(lines) == 4 and all("[0, 10)" in m for m in lines), lines
    assert "X-Goog-Signature=***" in lines[0] and "https://***@h/b/b.ar" in lines[2], lines
    assert_clean("\n".join(lines), "the retry log")


# -- errors -------------------------------------------------------------------------------------

def _open_error(paths, options) -> BaseException:
    async def run():
        await al.ArrayRecordSource.open(paths, storage_options=options)

    with pytest.raises(Exception) as info:
        asyncio.run(run())
    return info.value


def _loader_error(paths, options) -> BaseException:
    async def run():
        async with _pipeline(paths, options).loader(workers=0) as it:
            async for _ in it:
                pass

    with pytest.raises(Exception) as info:
        asyncio.run(run())
    return info.value


@pytest.mark.parametrize("how", ["open", "loader"])
def test_missing_objects_name_no_secret(gcs, how):
    base = f"{gcs.server_endpoint}/{gcs.bucket}"
    fail = _open_error if how == "open" else _loader_error
    for url in [signed(base, "missing.ar"), with_password(base, "missing.ar")]:
        exc = fail([url], HTTP_OPTIONS)
        assert isinstance(exc, FileNotFoundError), repr(exc)
        assert_error_clean(exc, f"{how} error")
        assert "missing.ar" in str(exc)
        assert "no files match" not in str(exc)  # a signed URL is a URL, not a glob


@pytest.mark.parametrize("how", ["open", "loader"])
def test_forbidden_names_no_secret(no_faults, how, monkeypatch):
    gcs = no_faults
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")
    gcs.set_faults(error_rate=1.0, statuses=(403,))
    fail = _open_error if how == "open" else _loader_error
    base = f"{gcs.endpoint}/{gcs.bucket}"  # through the delay line: it answers 403
    cases = [
        ([signed(base, "a.ar")], HTTP_OPTIONS),
        ([with_password(base, "a.ar")], HTTP_OPTIONS),
        ([gcs.url("a.ar")], {"token": TOKEN, "endpoint_url": gcs.endpoint,
                             "refresh_token": REFRESH}),
    ]
    for paths, options in cases:
        exc = fail(paths, options)
        assert isinstance(exc, PermissionError), repr(exc)
        assert_error_clean(exc, f"{how} error")
        assert "403" in str(exc) and "a.ar" in str(exc)


def test_a_state_from_another_pipeline_is_refused_without_secrets(gcs):
    base = f"{gcs.server_endpoint}/{gcs.bucket}"
    state = {"version": 1, "position": 3, "skip": 0, "rows": 0, "unit": 1,
             "process_count": 1,
             "pipeline": [f"source({signed(base, 'a.ar')} +1 more)", "shuffle(seed=8)"]}
    ds = _pipeline([signed(base, "a.ar"), with_password(base, "b.ar")], {})
    with pytest.raises(ValueError, match="different pipeline") as info:
        ds.loader(state=state)
    assert_error_clean(info.value, "state error")


def test_a_state_saved_by_earlier_versions_still_resumes(gcs):
    """Before secrets were hidden, the fingerprint held the raw first URL; such a state (and
    one whose URL was signed again since: a new signature) resumes the same pipeline."""
    base = f"{gcs.server_endpoint}/{gcs.bucket}"
    paths = [signed(base, "a.ar"), with_password(base, "b.ar")]
    ds = _pipeline(paths, {})
    full = [int(np.asarray(b["id"])[0]) for b in ds.loader(workers=0)]
    for first in [paths[0], paths[0].replace(SIGNATURE, "re-signed-0123")]:
        state = {"version": 1, "position": 5, "skip": 0, "rows": 0, "unit": 1,
                 "process_count": 1,
                 "pipeline": [f"source({first} +1 more)", "shuffle(seed=7)", "map(decode)",
                              "map(only_id_noise_det)", "batch(1)"]}
        loader = ds.loader(workers=0)
        assert loader.get_state()["pipeline"][1:] == state["pipeline"][1:]
        rest = [int(np.asarray(b["id"])[0]) for b in ds.loader(workers=0, state=state)]
        assert rest == full[5:]
        loader.close()


def test_convert_errors_name_the_input_without_its_signature(tmp_path):
    from aioloader.tools.convert import ConvertError, guess_format

    url = "https://host/data/part?X-Goog-Signature=deadbeefsecret&X-Goog-Date=1"
    with pytest.raises(ConvertError) as err:
        guess_format(url)
    assert "deadbeefsecret" not in str(err.value) and "host/data/part" in str(err.value)


class _HTTPStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status} from https://h/x.ar?X-Amz-Signature={SIGNATURE}")
        self.status = status


@pytest.mark.parametrize("status, retried", [(400, False), (410, False), (503, True)])
def test_fsspec_reads_retry_only_what_can_succeed(status, retried):
    """A 4xx from an fsspec store is final (named, not 'unavailable, retry later'); a 5xx is
    retried like the same answer from gs:// (found in review: every OSError was retried).
    fsspec's memory filesystem answering with an HTTP status is the one mock: the emulator's
    fault injection does not reach fsspec's HTTP reads."""
    from fsspec.implementations.memory import MemoryFileSystem

    class Failing(MemoryFileSystem):
        protocol = "failing"
        calls = 0

        def cat_file(self, path, start=None, end=None, **kw):
            Failing.calls += 1
            raise _HTTPStatus(status)

    fsspec.register_implementation("failing", Failing, clobber=True)

    async def run():
        storage = Storage(retry=al.RetryPolicy(attempts=4, base_delay=0.01))
        try:
            with pytest.raises(al.StorageError) as info:
                await storage.read("failing://b/x.ar", 0, 10)
            return info.value, storage.stats.retries
        finally:
            await storage.aclose()

    exc, retries = asyncio.run(run())
    assert str(status) in str(exc) and "x.ar" in str(exc)
    assert_error_clean(exc, "read error")
    assert isinstance(exc, al.StoreUnavailableError) == retried
    assert (Failing.calls == 4) == retried and (retries == 3) == retried
